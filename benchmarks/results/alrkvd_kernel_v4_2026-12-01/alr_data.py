import torch
H, G, D, R, T = 8, 4, 128, 16, 128


def alr_data(B, L, dev, gen=None):
    nb = L // T
    u8 = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, device=dev, generator=gen)
    i8 = lambda *s: torch.randint(-127, 128, s, dtype=torch.int8, device=dev, generator=gen)
    f = lambda v, *s: (v * (1 + 0.1 * torch.rand(s, device=dev, generator=gen))).half()
    d = dict(KC=u8(B, H, L, D // 4), KS=f(0.1, B, H, L), KZ=f(-0.15, B, H, L), VC=u8(B, H, L, D // 4),
             VS=f(0.1, B, H, L), VZ=f(-0.15, B, H, L))
    for kv in "KV":
        d[kv + "B"] = i8(B, H, nb, R, D); d[kv + "BS"] = f(1 / (127 * D ** 0.5 / 4), B, H, nb, R)
        d[kv + "L"] = u8(B, H, nb, R, T); d[kv + "LS"] = f(2 / 255, B, H, nb, R); d[kv + "LZ"] = f(-1.0, B, H, nb, R)
    pos = torch.arange(L, device=dev, dtype=torch.float32)
    theta = 1e6 ** (-torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D)
    d["Cos"], d["Sin"] = torch.cos(pos[:, None] * theta), torch.sin(pos[:, None] * theta)
    return d


def alr_ref(q, d, scale, lr_keys=True):
    B = q.shape[0]
    def res(c, s, z):
        c = c.long(); codes = torch.cat([(c >> (2 * r)) & 3 for r in range(4)], -1).float()
        return codes * s.float()[..., None] + z.float()[..., None]
    def low(kv):
        lat = d[kv + "L"].float() * d[kv + "LS"].float()[..., None] + d[kv + "LZ"].float()[..., None]  # [B,H,nb,R,T]
        basis = d[kv + "B"].float() * d[kv + "BS"].float()[..., None]  # [B,H,nb,R,D]
        return torch.einsum("bhnrt,bhnrd->bhntd", lat, basis).flatten(2, 3)  # [B,H,L,D]
    k = res(d["KC"], d["KS"], d["KZ"])
    if lr_keys:
        kl = low("K"); h = D // 2
        c, s = d["Cos"], d["Sin"]
        k = k + torch.cat([kl[..., :h] * c - kl[..., h:] * s, kl[..., h:] * c + kl[..., :h] * s], -1)
    v = res(d["VC"], d["VS"], d["VZ"]) + low("V")
    qq = q.float().view(B, H, G, D)
    p = torch.softmax(torch.einsum("bhgd,bhld->bhgl", qq, k) * scale, -1)
    return torch.einsum("bhgl,bhld->bhgd", p, v).reshape(q.shape)


def alr_args(d):
    return [d[k] for k in ("KB", "KBS", "KL", "KLS", "KLZ", "VB", "VBS", "VL", "VLS", "VLZ", "Cos", "Sin")]
