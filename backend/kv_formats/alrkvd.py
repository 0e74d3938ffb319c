"""`alrkvd`: adaptive low rank + low-bit residual (ALR-KVD), windowed, keys before RoPE. Math, options and the
storage layouts the kernels read: docs/ALRKVD.md. Read on CUDA by kernels/alrkvd_attention.py, written by
kernels/alrkvd_compress.py."""
from __future__ import annotations

import functools
import math

import torch

from backend import trellis
from backend.kv_formats.base import FormatKernels, KVFormat
from backend.kv_formats.codecs import (LOG_SCALE_STEPS, dequant_scaled, log_scale_base, log_scale_code,
                                       log_scale_round, quant_scaled, rotation_matrix, subspace_ritz, to_bool)
from kernels.codecs import (byte_table, dequant_asym, gauss_codebook, pack_bits, packed_len, quant_asym, unpack_bits,
                            unpack_levels)


class ALRKVDFormat(KVFormat):
    """Adaptive low-rank + low-bit residual KV compression (ALR-KVD).

    Per (layer, block) and per stream s in (K head 0..H-1, V head 0..H-1), X_s [T, D] (keys before RoPE):
      1. SVD X_s = U S W^T (the block's own data).  The ranks r_s of all 2H streams share a fixed budget
         ``rank_budget`` (total rows per block, so the block has a fixed size): water-filling on the
         normalized energy S_i^2 / sum S^2 (keys weighted by ``key_weight``), each r_s within [rank_min, rank_max].
      2. Basis rows W_s[:, :r_s]^T stored int8 with one fp16 scale per row; latents L = X_s B^T (with the
         dequantized basis B) stored with ``latent_bits`` asymmetric codes, fp16 scale and zero per row.
      3. Residual E = X_s - L_hat B, rotated by a fixed randomized Hadamard matrix R (E R), quantized with
         ``k_bits`` / ``v_bits`` per element on the Gaussian Lloyd-Max levels (``codebook=gauss``), by a trellis
         code over the group (``codebook=trellis``, backend/trellis.py: the same bytes, 1.3 dB less error) or on
         uniform asymmetric levels (``codebook=uniform``), one fp16 scale (and zero for uniform) per ``group``
         consecutive channels of a token.  With ``v_low_tokens`` n > 0, in each block and kv head the n tokens
         that received the least attention while in the window (``saliency``, from the cache) keep
         ``v_low_bits``-bit value residuals: an unimportant token's value barely reaches the output.
    Decode: X_hat = L_hat B + E_hat R^T; the cache applies RoPE to keys after decode (``rope_on_read``).
    Blocks are segments: each block gets its own basis when it is encoded, and encoding a block never
    touches any other block (the refresh of the basis for the next segment is the next encode)."""

    name = "alrkvd"
    windowed = True
    rope_on_read = True
    default_block_size = 128
    encode_waits_on_host = True  # the basis solve's eigh checks its result on the host (`ritz_solve`)
    OPTIONS = {
        "rank_budget": (int, None),      # total rank rows per (layer, block) over 2H streams; None -> see below
        "rank_per_head": (float, 4.0),   # default budget = round(rank_per_head * 2H)
        "rank_min": (int, 0),
        "rank_max": (int, None),         # None -> head_dim // 2
        "key_weight": (float, 4.0),      # energy weight of key streams vs value streams in water-filling
        "latent_bits": (int, 8),
        "basis_bits": (int, 8),
        "k_bits": (int, 2),
        "v_bits": (int, 2),
        "group": (int, None),            # residual scale group (channels of one token); None: head_dim, one scale
                                         # per token and head, as the decode kernel reads
        "codebook": (str, "gauss"),      # gauss | trellis | uniform
        "trellis_state_bits": (int, None),   # codebook=trellis: L of the k_bits/v_bits codes (None: 8 or 9; 12: less
                                             # error, 8x the work); v_low_bits codes keep the default
        "scale_bits": (int, 16),         # residual scales: 16 (fp16) or 8 (log2 steps of 1/16 under a per-block fp16 base)
        "rotate": (to_bool, True),      # randomized Hadamard on the residual
        "seed": (int, 1234),
        "exact_tokens": (int, 0),        # per block, the tokens with the largest residual energy kept exactly (fp16)
        "key_frame": (str, "pre_rope"),  # keys compressed before RoPE (pre_rope), the residual after it (post_rope),
                                         # or basis, latents and residual all after it (rotated: no RoPE in a kernel)
        "basis_solver": (str, "eigh"),   # eigh: exact, on the CPU | subspace: top rank_max + 8 directions, on the data's device
        "v_low_tokens": (int, 0),        # per block and kv head: the least salient tokens get v_low_bits values
        "v_low_bits": (int, 2),
    }

    def _validate(self):
        o = self.options
        H, D, T = self.num_kv_heads, self.head_dim, self.block_size
        if o["group"] is None:
            o["group"] = D
        if o["rank_max"] is None:
            o["rank_max"] = D // 2
        if o["rank_budget"] is None:
            o["rank_budget"] = int(round(o["rank_per_head"] * 2 * H))
        if not 0 <= o["rank_min"] <= o["rank_max"] <= min(D, T):
            raise ValueError(f"need 0 <= rank_min <= rank_max <= min(head_dim, block_size), got {o['rank_min']}, {o['rank_max']}")
        if not 2 * H * o["rank_min"] <= o["rank_budget"] <= 2 * H * o["rank_max"]:
            raise ValueError(f"rank_budget {o['rank_budget']} outside [{2 * H * o['rank_min']}, {2 * H * o['rank_max']}]")
        for key in ("latent_bits", "basis_bits", "k_bits", "v_bits"):
            if not 1 <= o[key] <= 8:
                raise ValueError(f"{key} must be in 1..8")
        if o["codebook"] not in ("gauss", "trellis", "uniform"):
            raise ValueError("codebook must be gauss, trellis or uniform")
        if o["codebook"] == "gauss" and max(o["k_bits"], o["v_bits"]) > 6:
            raise ValueError("gauss codebook supports up to 6 bits")
        if o["codebook"] == "trellis":
            if max(o["k_bits"], o["v_bits"]) > max(trellis.DEFAULT_STATE_BITS) or o["group"] < 8:
                raise ValueError(f"trellis codebook supports up to {max(trellis.DEFAULT_STATE_BITS)} bits and groups of 8 or more")
            for bits in (o["k_bits"], o["v_bits"]):
                trellis.codebook(bits, o["trellis_state_bits"])          # raises if no table is shipped
        elif o["trellis_state_bits"] is not None:
            raise ValueError("trellis_state_bits applies to codebook=trellis only")
        if o["basis_solver"] not in ("eigh", "subspace"):
            raise ValueError("basis_solver must be eigh or subspace")
        if o["key_frame"] not in ("pre_rope", "post_rope", "rotated"):
            raise ValueError("key_frame must be pre_rope, post_rope or rotated")
        if o["scale_bits"] not in (8, 16) or (o["scale_bits"] == 8 and o["codebook"] == "uniform"):
            raise ValueError("scale_bits must be 16, or 8 with the gauss or trellis codebook")
        if o["v_low_tokens"] and not (0 < o["v_low_tokens"] < T and 1 <= o["v_low_bits"] < o["v_bits"]):
            raise ValueError("v_low_tokens must be in 1..block_size-1 and v_low_bits in 1..v_bits-1")
        if D % o["group"] or D % 8 or T % 8:
            raise ValueError("group must divide head_dim; head_dim and block_size must be multiples of 8")

    def _allocate(self):
        o = self.options
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R = o["rank_budget"]
        G = D // o["group"]
        self._alloc("ranks", (2 * H,), torch.int16)                       # K heads then V heads
        if R > 0:
            self._alloc("basis", (R, packed_len(D, o["basis_bits"]) if o["basis_bits"] < 8 else D),
                        torch.uint8 if o["basis_bits"] < 8 else torch.int8)
            self._alloc("basis_scale", (R,), torch.float16)
            # stream-major ([R, T] in memory): a stream's latents are rows of T contiguous bytes for the kernel
            self._alloc("latent", (T, packed_len(R, o["latent_bits"]) if R % 8 == 0 or o["latent_bits"] == 8
                                   else self._raise_r()), torch.uint8, order=(1, 0))
            self._alloc("latent_scale", (R,), torch.float16)
            self._alloc("latent_zero", (R,), torch.float16)
        uni = o["codebook"] == "uniform"
        head_major = (1, 2, 0)  # [T, H, G] scales stored as [H, G, T]: a head's tokens contiguous for the kernel
        n_low = o["v_low_tokens"]
        if n_low:   # per head: its salient tokens' codes in token order, then the rest's; which is which
            self._alloc("v_resid_low", (n_low, H, packed_len(D, o["v_low_bits"])), torch.uint8)
            self._alloc("v_low", (H, T // 8), torch.uint8)                 # bit t of head h: token t is low
        for kv, bits in (("k", o["k_bits"]), ("v", o["v_bits"])):
            # values' codes stored as [H, packed, T]: for the kernel a byte column's tokens are contiguous, as its
            # value dot (tokens along k) pairs them; keys' as [H, T, packed] (their dot pairs a token's columns, and
            # a head's tokens contiguous read 2-3% faster on the H200 than [T, H, packed]: BENCHMARKS.md section 2s)
            self._alloc(f"{kv}_resid", (T - (n_low if kv == "v" else 0), H, packed_len(D, bits)), torch.uint8,
                        order=head_major if kv == "v" else (1, 0, 2))
            if o["scale_bits"] == 8:
                self._alloc(f"{kv}_rscale", (T, H, G), torch.uint8, order=head_major)
                self._alloc(f"{kv}_rbase", (H,), torch.float16)
            else:
                self._alloc(f"{kv}_rscale", (T, H, G), torch.float16, order=head_major)
            if uni:
                self._alloc(f"{kv}_rzero", (T, H, G), torch.float16, order=head_major)
        if o["exact_tokens"]:
            n = o["exact_tokens"]
            self._alloc("exact_idx", (n,), torch.int16)
            self._alloc("exact_k", (n, H, D), torch.float16)
            self._alloc("exact_v", (n, H, D), torch.float16)
        self._rot = rotation_matrix(D, o["seed"]).to(self.device) if o["rotate"] else None
        self._rotary = None
        self._byte_tables = {}  # the PyTorch decode's one-plane residual codes, rebuilt a byte at a time
        for kv in "kv":
            bits = o[f"{kv}_bits"]
            if o["codebook"] != "trellis" and bits in (1, 2, 4, 8):
                levels = gauss_codebook(bits) if o["codebook"] == "gauss" else torch.arange(1 << bits)
                self._byte_tables[kv] = byte_table(levels, bits).to(self.device)

    def set_rotary(self, rotary) -> None:
        """The model's RoPE tables (an object with ``cos``/``sin`` [max_len, D], HF half-split layout), needed
        by ``key_frame=post_rope`` and ``rotated``."""
        self._rotary = rotary

    def _rope(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """RoPE (or its inverse) of x [..., T, H, D] at positions [T] (float32)."""
        if self._rotary is None:
            raise ValueError(f"alrkvd key_frame={self.options['key_frame']} needs the model's RoPE tables: "
                             "call set_rotary(rotary)")
        cos = self._rotary.cos[positions].to(x.device, torch.float32)[:, None]     # [T, 1, D]
        sin = self._rotary.sin[positions].to(x.device, torch.float32)[:, None]
        half = x.shape[-1] // 2
        rot_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos - rot_half * sin if inverse else x * cos + rot_half * sin

    def _positions(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.device)

    def _unrotated_keys(self, keys: torch.Tensor, start_pos) -> torch.Tensor:
        """Keys [n, T, H, D] of n blocks taken back through RoPE: consecutive from ``start_pos``, or from each
        block's first position (a tensor [n])."""
        n, T = keys.shape[:2]
        starts = (start_pos.to(self.device) if torch.is_tensor(start_pos)
                  else start_pos + T * torch.arange(n, device=self.device))
        positions = (starts[:, None] + torch.arange(T, device=self.device)).flatten()
        return self._rope(keys.flatten(0, 1), positions, inverse=True).unflatten(0, (n, T))

    def _raise_r(self):
        raise ValueError("rank_budget must be a multiple of 8 when latent_bits < 8")

    LLOYD_MAX_DISTORTION = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499, 6: 0.0006642}

    @classmethod
    def relative_error_bound(cls, bits: int) -> float:
        """Stated bound on ||X_s - X_hat_s||_F / ||X_s||_F for one stream (head) of one block: the residual
        quantizer's relative error, 1.4 x sqrt(Lloyd-Max distortion of a unit Gaussian at ``bits``) (the
        rotation makes the residual near-Gaussian; the per-group scale search keeps it near the optimum;
        latent and basis quantization errors are absorbed by the residual, whose energy is at most the
        stream's).  Uniform codebooks and 7-8 bits use the same form with the uniform quantizer's error."""
        d = cls.LLOYD_MAX_DISTORTION.get(bits, 0.0006642 / 4 ** (bits - 6))
        return 1.4 * math.sqrt(d)

    # -- rank allocation ---------------------------------------------------------------------------------
    def allocate_ranks(self, svals: torch.Tensor, total: torch.Tensor | None = None) -> torch.Tensor:
        """Water-filling: svals [..., 2H, m] descending -> ranks [..., 2H] (long, on svals' device) summing to
        rank_budget, each in [rank_min, rank_max], maximizing the captured (weighted, normalized) energy.
        ``total`` [..., 2H]: each stream's whole energy (sum of all squared singular values) when svals holds
        only the leading ones. Leading dims are independent blocks."""
        o = self.options
        S2 = svals.float().pow(2)
        total = S2.sum(-1) if total is None else total.float()
        e = S2 / total[..., None].clamp_min(1e-20)
        H = self.num_kv_heads
        w = torch.ones(2 * H, device=e.device)   # made on the device: no host-to-device copy (a sync)
        w[:H] = o["key_weight"]
        e = e * w[..., None]
        lo, hi = o["rank_min"], min(o["rank_max"], svals.shape[-1])
        ranks = torch.full(e.shape[:-1], lo, dtype=torch.long, device=e.device)
        extra = o["rank_budget"] - 2 * H * lo
        if extra > 0:
            cand = e[..., lo:hi]                                      # [..., 2H, hi-lo]
            # strictly decreasing tie-break so that top-k picks prefixes of each stream
            cand = cand - torch.arange(hi - lo, device=e.device, dtype=e.dtype) * 1e-12
            top = torch.topk(cand.flatten(-2), extra).indices         # [..., extra]
            ranks.scatter_add_(-1, top // (hi - lo), torch.ones_like(top))
        return ranks

    def quantized_basis(self, svals: torch.Tensor, vh: torch.Tensor, total: torch.Tensor):
        """Blocks' bases from their `_svd` (svals [..., 2H, m], vh [..., 2H, m, D], total [..., 2H]): ranks
        [..., 2H] by water-filling, the leading rows of each stream [..., R, D] as symmetric ``basis_bits``
        codes (float) and their fp16 scales [..., R]. Leading dims are independent blocks (no host sync)."""
        ranks = self.allocate_ranks(svals, total)
        # budget row r belongs to the stream whose [start, end) holds it, as that stream's row r - start
        ends = ranks.cumsum(-1)
        r = torch.arange(self.options["rank_budget"], device=ranks.device).expand(*ranks.shape[:-1], -1).contiguous()
        owner = torch.searchsorted(ends, r, right=True)
        local = r - (ends - ranks).gather(-1, owner)
        index = (owner * vh.shape[-2] + local)[..., None].expand(*r.shape, vh.shape[-1])
        rows = vh.flatten(-3, -2).gather(-2, index)
        qmax = (1 << (self.options["basis_bits"] - 1)) - 1
        bscale = (rows.abs().amax(-1) / qmax).to(torch.float16)
        bq = torch.round(rows / bscale.float().clamp_min(1e-8)[..., None]).clamp_(-qmax, qmax)
        return ranks, bq, bscale

    # -- encode / decode ----------------------------------------------------------------------------------
    def _quant_resid(self, e: torch.Tensor, bits: int, low: bool = False):
        """e: [..., T, H, D] (leading dims: blocks) -> codes [..., T, H, D], stored scale [..., T, H, G] (fp16, or
        uint8 log codes), zero or None, base [..., H] (8-bit scales: one per block and head) or None. ``low``: the
        v_low_bits codes (a trellis of the default size)."""
        *lead, T, H, D = e.shape
        g = self.options["group"]
        x = e.reshape(*lead, T, H, D // g, g)
        codebook = self.options["codebook"]
        L = None if low else self.options["trellis_state_bits"]
        if codebook != "uniform":
            if self.options["scale_bits"] == 8:
                rms = x.pow(2).mean(-1, keepdim=True).sqrt()
                base = log_scale_base(rms.amax(dim=(-4, -2, -1)) * 1.25)              # [..., H] fp16
                bb = base.view(*lead, 1, H, 1, 1)
                q, s = quant_scaled(x, bits, codebook, lambda t: log_scale_round(t, bb), L)
                return q.reshape(*lead, T, H, D), log_scale_code(s, bb)[..., 0], None, base
            q, s = quant_scaled(x, bits, codebook, state_bits=L)
            return q.reshape(*lead, T, H, D), s[..., 0].to(torch.float16), None, None
        q, s, z = quant_asym(x, bits, dim=-1)
        return q.reshape(*lead, T, H, D), s[..., 0], z[..., 0], None

    def _dequant_resid(self, q, s, z, bits, base=None, low=False, levels=None):
        """Residuals [..., D] from codes q, or from ``levels`` (the codes' levels already looked up: Lloyd-Max
        levels, or uniform codes as floats), their scales s (and zeros z)."""
        g = self.options["group"]
        shp = (q if levels is None else levels).shape
        if base is not None:                    # s: uint8 log codes [..., T, H, G], base [..., H]
            s = base.float()[..., None, :, None] * torch.exp2(-s.float() / LOG_SCALE_STEPS)
        if levels is not None:
            x = levels.reshape(*shp[:-1], shp[-1] // g, g) * s[..., None].float()
            x = x if z is None else x + z[..., None].float()
        elif z is None:
            x = dequant_scaled(q.reshape(*shp[:-1], shp[-1] // g, g), s[..., None], bits, self.options["codebook"],
                               None if low else self.options["trellis_state_bits"])
        else:
            x = dequant_asym(q.reshape(*shp[:-1], shp[-1] // g, g), s[..., None], z[..., None])
        return x.reshape(shp)

    def _svd(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Leading singular values [N, m] (descending), the right singular vectors as rows [N, m, D] and each
        matrix's energy [N] (sum of all squared singular values) of X [N, T, D], from the D x D Gram matrix.
        ``basis_solver=eigh``: all m = D, float64 on the CPU. ``subspace``: m = min(rank_max + 8, D) by
        `subspace_eigh`'s steps, float64 on X's device (on the H200 2 ms for 512 matrices of 128 x 128 at 24
        directions, against 738 ms for the CPU eigh: benchmarks/bench_basis.py)."""
        Q, M, total = self._ritz(X)
        return self._singular(Q, total, *self.ritz_solve(M))

    def _ritz(self, X: torch.Tensor):
        """`_svd` up to its eigendecomposition (no host sync): the subspace Q [N, D, m] (None: exact), the
        matrix to decompose M (Q^T G Q, or the Gram G itself) and each matrix's energy (None: from the
        singular values)."""
        G = (X.transpose(1, 2) @ X).double()
        if self.options["basis_solver"] == "eigh":
            return None, G, None
        Q, M = subspace_ritz(G, min(self.options["rank_max"] + 8, G.shape[-1]), self.options["seed"])
        return Q, M, G.diagonal(dim1=-2, dim2=-1).sum(-1).float()

    def ritz_solve(self, M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenpairs of `_ritz`'s M (the exact solver's on the CPU). On CUDA the host waits here: eigh checks
        its result on the host."""
        if self.options["basis_solver"] == "eigh":
            w, U = torch.linalg.eigh(M.cpu())
            return w.to(M.device), U.to(M.device)
        return torch.linalg.eigh(M)

    @staticmethod
    def _singular(Q, total, w: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_svd`'s result from `_ritz` (Q, total) and `ritz_solve` (eigenpairs, ascending)."""
        S = w.flip(-1).clamp_min(0).sqrt().float()
        U = (V if Q is None else Q @ V).flip(-1).transpose(1, 2).float()
        return S, U, S.pow(2).sum(-1) if total is None else total

    @property
    def wants_saliency(self) -> bool:
        return self.options["v_low_tokens"] > 0

    def encode(self, layer, block_id, k, v, start_pos: int | None = None, saliency: torch.Tensor | None = None):
        """Compress one full block: k [T, H, D] before RoPE, v [T, H, D].  ``start_pos`` (the position of
        the block's first token) is needed by ``key_frame=post_rope`` and ``rotated`` only; ``saliency`` [T, H] (the mean
        attention each token received from the queries that saw it) by ``v_low_tokens``."""
        self.encode_blocks([(layer, block_id, start_pos, k, v) + (() if saliency is None else (saliency,))])

    def encode_blocks(self, blocks):
        """`encode` of several full blocks, each (layer, block id, first position, k, v[, saliency]), batched: one
        decomposition and one quantization for all of them (the blocks a prefill chunk fills in every layer); each
        block's codes are what `encode` alone writes."""
        if not blocks:
            return
        o = self.options
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R, n = o["rank_budget"], len(blocks)
        layers, block_ids, starts, ks, vs = (list(t) for t in zip(*(b[:5] for b in blocks)))
        if o["key_frame"] != "pre_rope" and None in starts:
            raise ValueError(f"alrkvd key_frame={o['key_frame']}: encode needs start_pos (the block's first position)")
        rows = torch.tensor([layer * self.num_blocks + int(b) for layer, b in zip(layers, block_ids)],
                            device=self.device)

        def put(name, value):  # each block's entry of a storage tensor
            getattr(self, name).flatten(0, 1)[rows] = value

        def positions():  # [n * T]: each block's tokens
            first = torch.tensor(starts, device=self.device)[:, None]
            return (first + torch.arange(T, device=self.device)).flatten()
        k, v = torch.stack(ks), torch.stack(vs)
        keys = k.float()
        if o["key_frame"] == "rotated":   # the whole key in the frame of the rotated keys
            keys = self._rope(keys.flatten(0, 1), positions()).unflatten(0, (n, T))
        X = torch.cat([keys, v.float()], dim=2).permute(0, 2, 1, 3).contiguous()   # [n, 2H, T, D]
        rec = torch.zeros_like(X)
        if R > 0:
            ranks, bq, bscale = self._block_bases(X)
            B = bq * bscale.float()[..., None]                                        # dequantized [n, R, D]
            r = torch.arange(R, device=X.device).expand(n, R).contiguous()
            owner = torch.searchsorted(ranks.cumsum(-1), r, right=True)               # [n, R]: stream of each row
            lat = torch.einsum("nrtd,nrd->ntr", X.gather(1, owner[..., None, None].expand(n, R, T, D)), B)
            lq, ls, lz = quant_asym(lat, o["latent_bits"], dim=1)
            latd = dequant_asym(lq, ls, lz)                                           # [n, T, R]
            contrib = latd.transpose(1, 2)[..., None] * B[:, :, None, :]              # [n, R, T, D]
            streams = owner + 2 * H * torch.arange(n, device=X.device)[:, None]
            rec.view(n * 2 * H, T, D).index_add_(0, streams.flatten(), contrib.flatten(0, 1))
            put("ranks", ranks.to(torch.int16))
            bb = o["basis_bits"]
            put("basis", bq.to(torch.int8) if bb == 8 else pack_bits((bq + (1 << (bb - 1))).to(torch.int32), bb))
            put("basis_scale", bscale)
            put("latent", pack_bits(lq, o["latent_bits"]))
            put("latent_scale", ls[:, 0])
            put("latent_zero", lz[:, 0])
        else:
            put("ranks", torch.zeros(n, 2 * H, dtype=torch.int16, device=self.device))
        E = (X - rec).permute(0, 2, 1, 3)                                             # [n, T, 2H, D]
        if o["exact_tokens"]:
            energy = E.pow(2).sum(dim=(2, 3))                                         # [n, T]
            idx = torch.topk(energy, o["exact_tokens"]).indices.sort().values         # [n, e]
            put("exact_idx", idx.to(torch.int16))
            pick = torch.arange(n, device=self.device)[:, None], idx
            put("exact_k", k[pick].to(torch.float16))
            put("exact_v", v[pick].to(torch.float16))
        if o["key_frame"] == "post_rope":  # key residual in the frame of the rotated keys: RoPE(k) - RoPE(L_hat B)
            E = torch.cat([self._rope(E[:, :, :H].flatten(0, 1), positions()).unflatten(0, (n, T)), E[:, :, H:]], dim=2)
        if self._rot is not None:
            E = E @ self._rot
        for kv, sl, bits in (("k", slice(0, H), o["k_bits"]), ("v", slice(H, 2 * H), o["v_bits"])):
            q, s, z, base = self._quant_resid(E[:, :, sl], bits)
            if kv == "v" and o["v_low_tokens"]:  # per block: which tokens are low depends on its saliency
                low = [self._split_low(layer, b, E[i, :, sl], q[i], s[i], None if z is None else z[i],
                                       blocks[i][5] if len(blocks[i]) > 5 else None)
                       for i, (layer, b) in enumerate(zip(layers, block_ids))]
                q, s = torch.stack([x[0] for x in low]), torch.stack([x[1] for x in low])
                z = None if z is None else torch.stack([x[2] for x in low])
            put(f"{kv}_resid", pack_bits(q, bits))
            put(f"{kv}_rscale", s)
            if z is not None:
                put(f"{kv}_rzero", z)
            if base is not None:
                put(f"{kv}_rbase", base)

    def kernels(self, max_rows):
        """The decode kernel (kernels/alrkvd_attention.py) and, with it, the compression kernel (`encode_with_kernel`)
        and the rebuild of a sequence's blocks (`alrkvd_rebuild_blocks`) for the options the decode kernel reads."""
        from kernels.alrkvd_attention import AlrkvdLayer, alrkvd_decode_attention, alrkvd_rebuild_blocks, tile_rows
        try:
            layers = [AlrkvdLayer.from_format(self, i) for i in range(self.num_layers)]
        except NotImplementedError as e:  # options the kernel does not read
            return self._no_kernels(str(e))
        # the kernel's merge tickets, zeros between calls: held here so a CUDA graph holds no memset
        tickets = torch.zeros(max_rows * self.num_kv_heads, dtype=torch.int32, device=self.device)
        return FormatKernels(functools.partial(alrkvd_decode_attention, tickets=tickets), layers,
                             self.encode_with_kernel, rebuild=alrkvd_rebuild_blocks, tile_rows=tile_rows)

    def compress_options(self):
        """The options the Triton compression kernel reads (kernels/alrkvd_compress.py); NotImplementedError for
        options it does not write."""
        from kernels.alrkvd_compress import CompressOptions, check_options
        o = self.options
        if o["latent_bits"] != 8 or o["basis_bits"] != 8 or o["rank_budget"] <= 0 or o.get("scale_bits", 16) != 16:
            raise NotImplementedError("the ALR-KVD compression kernel writes latent_bits=8, basis_bits=8, "
                                      "rank_budget>0, scale_bits=16")
        opts = CompressOptions(k_bits=o["k_bits"], v_bits=o["v_bits"], group=o["group"], codebook=o["codebook"],
                               rank_max=o["rank_max"], post_rope=o["key_frame"] == "post_rope")
        check_options(opts, self.head_dim)
        return opts

    def encode_with_kernel(self, layer, block_ids, k: torch.Tensor, v: torch.Tensor, start_pos=None) -> None:
        """What `encode` does per block, for full blocks `k, v [n, T, H, D]` (keys before RoPE) into `block_ids`,
        with the Triton compression kernel (kernels/alrkvd_compress.py; latent_bits = basis_bits = 8,
        rank_budget > 0): the basis here in PyTorch, then the kernel. `layer`: the layer of every block, or a
        list of each block's layer (one call for every layer of a decode step). `start_pos` [n]: each block's
        first position (key_frame=post_rope and rotated only). In three stages, which CUDA graphs replay
        around the one where the host waits (backend/cuda_graphs.py `CompressGraphs`): `compress_ritz`,
        `ritz_solve`, `compress_store`."""
        from kernels.alrkvd_compress import device_indices
        self.compress_options()  # refuses the options the kernel does not write
        H, D, T = self.num_kv_heads, self.head_dim, self.block_size
        assert k.shape == v.shape and k.shape[1:] == (T, H, D) and k.stride() == v.stride() and k.stride(-1) == 1
        assert T & (T - 1) == 0 and D & (D - 1) == 0, "block_size and head_dim must be powers of two"
        n = len(block_ids)
        assert n == k.shape[0]
        if n == 0:
            return
        if self.options["key_frame"] != "pre_rope" and (start_pos is None or self._rotary is None):
            raise ValueError(f"alrkvd key_frame={self.options['key_frame']}: compress needs start_pos and "
                             "fmt.set_rotary(rotary)")
        layers = layer if isinstance(layer, (list, tuple)) else [layer] * n
        rows = device_indices(self.storage_rows(layers, block_ids), k.device)
        starts = None if start_pos is None else device_indices(start_pos, k.device)
        k, v, Q, M, total = self.compress_ritz(k, v, starts)
        self.compress_store(rows, starts, k, v, Q, total, *self.ritz_solve(M))

    def storage_rows(self, layers, block_ids) -> list[int]:
        """Each block's row in the (layer, block)-flattened storage that the compression kernel writes."""
        return [layer * self.ranks.shape[1] + block for layer, block in zip(layers, block_ids)]

    def compress_ritz(self, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor | None):
        """`encode_with_kernel`'s first stage (no host sync): the blocks in the frame the kernel compresses them
        in (key_frame=rotated: keys through RoPE at `starts`' positions, in float32), and the basis's `_ritz`."""
        n, T = k.shape[:2]
        if self.options["key_frame"] == "rotated":  # the whole key after RoPE, then compressed as pre_rope
            pos = (starts[:, None] + torch.arange(T, device=k.device)).flatten()
            k = self._rope(k.flatten(0, 1).float(), pos).unflatten(0, (n, T))
            v = v.float()
        return (k, v, *self._ritz(torch.cat([k.float(), v.float()], dim=2).permute(0, 2, 1, 3).flatten(0, 1)))

    def compress_store(self, rows: torch.Tensor, starts, k, v, Q, total, w: torch.Tensor, V: torch.Tensor) -> None:
        """`encode_with_kernel`'s last stage (no host sync): the bases from `ritz_solve`'s eigenpairs (rank
        allocation, 8-bit codes) stored at `rows` [n] of the (layer, block)-flattened storage, then the kernel."""
        from kernels.alrkvd_compress import alrkvd_compress
        n, H = k.shape[0], self.num_kv_heads
        ranks, bq, bscale = self.quantized_basis(*(t.unflatten(0, (n, 2 * H)) for t in self._singular(Q, total, w, V)))
        self.ranks.flatten(0, 1)[rows] = ranks.to(torch.int16)
        self.basis.flatten(0, 1)[rows] = bq.to(torch.int8)
        self.basis_scale.flatten(0, 1)[rows] = bscale
        post = self.options["key_frame"] == "post_rope"
        alrkvd_compress(self.compress_options(), self.named_tensors(), rows, k, v, start_pos=starts if post else None,
                        cos=self._rotary.cos if post else None, sin=self._rotary.sin if post else None, rot=self._rot)

    def _block_bases(self, X: torch.Tensor):
        """Ranks, basis codes and scales (`quantized_basis`) of blocks X [n, 2H, T, D], one batched `_svd`: what
        `encode_blocks` stores."""
        return self.quantized_basis(*(t.unflatten(0, X.shape[:2]) for t in self._svd(X.flatten(0, 1))))

    def _split_low(self, layer, block_id, e, q, s, z, saliency):
        """Values with ``v_low_tokens``: the least salient tokens of each head requantized at ``v_low_bits``
        (their codes stored, their scales and zeros merged into s, z); returns the salient tokens' codes."""
        if saliency is None:
            raise ValueError("alrkvd v_low_tokens: encode needs the tokens' saliency (the cache measures it)")
        T, n_low, bits = self.block_size, self.options["v_low_tokens"], self.options["v_low_bits"]
        low = torch.zeros(T, self.num_kv_heads, dtype=torch.bool, device=e.device)
        low.scatter_(0, saliency.to(e.device).argsort(0)[:n_low], True)
        ql, sl, zl, _ = self._quant_resid(e, bits, low=True)   # the same per-block scale base as the salient codes
        order = self._low_last(low)[..., None].expand_as(q)                            # [T, H, D]
        self.v_resid_low[layer, block_id] = pack_bits(ql.gather(0, order[T - n_low:]), bits)
        self.v_low[layer, block_id] = pack_bits(low.t().to(torch.int32), 1)
        m = low[..., None]
        return q.gather(0, order[:T - n_low]), torch.where(m, sl, s), None if z is None else torch.where(m, zl, z)

    @staticmethod
    def _low_last(low: torch.Tensor) -> torch.Tensor:
        """Token order along dim -2 of low [..., T, H]: each head's salient tokens, then its low ones."""
        return torch.argsort(low.to(torch.uint8), dim=-2, stable=True)

    def _decode_values(self, layer, ids):
        """Dequantized value residuals [n, T, H, D] (rotated frame) of blocks ``ids``."""
        o = self.options
        T, D = self.block_size, self.head_dim
        s = self.v_rscale[layer, ids]
        z = self.v_rzero[layer, ids] if o["codebook"] == "uniform" else None
        base = self.v_rbase[layer, ids] if o["scale_bits"] == 8 else None
        q = unpack_bits(self.v_resid[layer, ids], o["v_bits"], D)
        n_low = o["v_low_tokens"]
        if not n_low:
            return self._dequant_resid(q, s, z, o["v_bits"], base)
        low = unpack_bits(self.v_low[layer, ids], 1, T).transpose(-1, -2).bool()       # [n, T, H]
        order = self._low_last(low)
        s, z = (None if t is None else t.gather(1, order[..., None].expand_as(t)) for t in (s, z))
        parts = [self._dequant_resid(c, s[:, a:b], None if z is None else z[:, a:b], bits, base, low)
                 for c, a, b, bits, low in ((q, 0, T - n_low, o["v_bits"], False),
                                            (unpack_bits(self.v_resid_low[layer, ids], o["v_low_bits"], D), T - n_low,
                                             T, o["v_low_bits"], True))]
        x = torch.cat(parts, dim=1)
        return torch.empty_like(x).scatter_(1, order[..., None].expand_as(x), x)

    def _residual(self, layer, ids, kv: str) -> torch.Tensor:
        """Dequantized key or value (``kv``) residuals [n, T, H, D] of blocks ``ids``, rotated frame."""
        o = self.options
        bits = o[f"{kv}_bits"]
        if kv == "v" and o["v_low_tokens"]:
            return self._decode_values(layer, ids)
        codes = getattr(self, f"{kv}_resid")[layer, ids]
        s = getattr(self, f"{kv}_rscale")[layer, ids]
        z = getattr(self, f"{kv}_rzero")[layer, ids] if o["codebook"] == "uniform" else None
        base = getattr(self, f"{kv}_rbase")[layer, ids] if o["scale_bits"] == 8 else None
        if kv not in self._byte_tables:
            return self._dequant_resid(unpack_bits(codes, bits, self.head_dim), s, z, bits, base)
        return self._dequant_resid(None, s, z, bits, base, levels=unpack_levels(codes, self._byte_tables[kv]))

    def decode_layers(self, layers: range, block_ids, start_pos=0):
        """`decode` of the same blocks in every layer of `layers` in one call (each operation over all of them, not
        once a layer: on the CPU, short histories cost the operations' overhead more than their work)."""
        ids = self._ids(block_ids, self.device)
        n, L, T = ids.numel(), len(layers), self.block_size
        if not torch.is_tensor(start_pos):
            start_pos = start_pos + T * torch.arange(n, device=self.device)
        k, v = self._decode(torch.as_tensor(list(layers), device=self.device).repeat_interleave(n),
                            ids.repeat(L), start_pos=start_pos.to(self.device).repeat(L))
        return k.view(L, n * T, *k.shape[1:]), v.view(L, n * T, *v.shape[1:])

    def decode(self, layer, block_ids, start_pos=0):
        """Keys before RoPE and values of the listed blocks; with ``key_frame=post_rope`` or ``rotated`` the blocks
        are taken as consecutive from position ``start_pos`` (the cache decodes a sequence's table from its start),
        or from each block's own first position (``start_pos`` a tensor [n]: blocks of several sequences)."""
        return self._decode(layer, self._ids(block_ids, self.device), start_pos)

    def _decode(self, layer, ids: torch.Tensor, start_pos=0):
        """`decode` of block ids [n] of `layer`: one layer, or each block's (a tensor [n]; `decode_layers`)."""
        o = self.options
        n = ids.numel()
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        R = o["rank_budget"]
        E = torch.empty(2, n, T, H, D, device=self.device)                             # keys, values
        for i, kv in enumerate("kv"):
            if self._rot is not None:
                torch.matmul(self._residual(layer, ids, kv), self._rot.t(), out=E[i])
            else:
                E[i] = self._residual(layer, ids, kv)
        if o["key_frame"] == "post_rope" and n:     # the key residual only
            E[0] = self._unrotated_keys(E[0], start_pos)
        if R > 0:
            bb = o["basis_bits"]
            if bb == 8:
                bq = self.basis[layer, ids].float()
            else:
                qmax = (1 << (bb - 1)) - 1
                bq = unpack_bits(self.basis[layer, ids], bb, D).float() - (qmax + 1)
            B = bq * self.basis_scale[layer, ids].float()[..., None]                 # [n, R, D]
            lq = unpack_bits(self.latent[layer, ids], o["latent_bits"], R)             # [n, T, R]
            lat = dequant_asym(lq, self.latent_scale[layer, ids][:, None], self.latent_zero[layer, ids][:, None])
            ranks = self.ranks[layer, ids].long()                                      # [n, 2H]
            # each basis row placed in its stream's columns: Bs[n, r, (s, d)] = B[n, r, d] if row r is stream s's
            ends = ranks.cumsum(-1)
            r = torch.arange(R, device=self.device)[None, :, None]
            owner = ((r >= (ends - ranks)[:, None, :]) & (r < ends[:, None, :])).float()   # [n, R, 2H]
            Bs = (owner[..., None] * B[:, :, None, :]).view(n, R, 2, H * D)
            for i in range(2):
                E[i].view(n, T, H * D).baddbmm_(lat, Bs[:, :, i])
        if o["key_frame"] == "rotated" and n:       # the whole key
            E[0] = self._unrotated_keys(E[0], start_pos)
        if o["exact_tokens"]:
            idx = self.exact_idx[layer, ids].long()                                    # [n, e]
            bidx = torch.arange(n, device=self.device)[:, None].expand_as(idx)
            E[0][bidx, idx] = self.exact_k[layer, ids].float()
            E[1][bidx, idx] = self.exact_v[layer, ids].float()
        return E[0].view(n * T, H, D).to(self.dtype), E[1].view(n * T, H, D).to(self.dtype)

    def key_scores(self, layer: int, block_id: int, q: torch.Tensor, start_pos: int | None = None) -> torch.Tensor:
        """Reference for fused kernels: q . k_hat for every token of one block, computed in the compressed
        domain, q [T, H, D] (one query per key token, in the pre-RoPE frame of that key, i.e. RoPE^-1(pos) q):
        (q B_s^T) . L_hat_s  +  (q' rot) . E_hat_rot  (exact tokens: q . k_exact), where q' = q for
        ``key_frame=pre_rope`` and q' = RoPE(pos) q, the query as it is, for ``post_rope`` (then ``start_pos``
        is the block's first position): with post_rope a kernel rotates the query by ``rot`` once and never
        touches the key residual again.  With ``rotated`` the low-rank part takes q' as well: (q' B_s^T) is one
        [R] vector per query and block, and no key is ever rotated.  Returns [T, H] float32."""
        o = self.options
        T, H, D = self.block_size, self.num_kv_heads, self.head_dim
        q = q.float()
        ids = torch.tensor([block_id], device=self.device)
        qq = unpack_bits(self.k_resid[layer, ids], o["k_bits"], D)[0]
        s_ = self.k_rscale[layer, ids][0]
        z = self.k_rzero[layer, ids][0] if o["codebook"] == "uniform" else None
        base = self.k_rbase[layer, ids][0] if o["scale_bits"] == 8 else None
        e_rot = self._dequant_resid(qq, s_, z, o["k_bits"], base)                       # [T, H, D] rotated frame
        q_res = q
        if o["key_frame"] != "pre_rope":
            q_res = self._rope(q, self._positions(start_pos, T))
        q_rot = q_res @ self._rot if self._rot is not None else q_res
        scores = (q_rot * e_rot).sum(-1)
        R = o["rank_budget"]
        if R > 0:
            bb = o["basis_bits"]
            if bb == 8:
                bq = self.basis[layer, block_id].float()
            else:
                bq = unpack_bits(self.basis[layer, block_id], bb, D).float() - (1 << (bb - 1))
            B = bq * self.basis_scale[layer, block_id].float()[:, None]                  # [R, D]
            lat = dequant_asym(unpack_bits(self.latent[layer, block_id], o["latent_bits"], R),
                               self.latent_scale[layer, block_id], self.latent_zero[layer, block_id])  # [T, R]
            ranks = self.ranks[layer, block_id].long().tolist()
            q_lr = q_res if o["key_frame"] == "rotated" else q
            start = 0
            for h in range(H):                                                           # key streams only
                r = ranks[h]
                if r:
                    qb = q_lr[:, h] @ B[start:start + r].t()                             # [T, r] latent-space query
                    scores[:, h] += (qb * lat[:, start:start + r]).sum(-1)
                start += r
        if o["exact_tokens"]:
            idx = self.exact_idx[layer, block_id].long()
            scores[idx] = (q[idx] * self.exact_k[layer, block_id].float()).sum(-1)
        return scores
