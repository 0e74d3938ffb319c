"""The batched sampler (`backend.sampling.sample`): the distribution each row asks for, seeded rows independent of
their batch, and a row's failure its own."""
import pytest
import torch

from backend.sampling import SamplingParams, sample

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
DRAWS = 20_000


def frequencies(params: SamplingParams) -> torch.Tensor:
    torch.manual_seed(0)
    tokens = sample(LOGITS.repeat(DRAWS, 1), [params] * DRAWS, [None] * DRAWS)
    return torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)) / DRAWS


def expected(temperature=1.0, keep=None) -> torch.Tensor:
    p = torch.softmax(LOGITS / temperature, -1)
    if keep is not None:
        p[keep:] = 0
    return p / p.sum()


@pytest.mark.parametrize("params, want", [
    (SamplingParams(temperature=1.0), expected()),
    (SamplingParams(temperature=0.5), expected(0.5)),
    (SamplingParams(temperature=1.0, top_k=3), expected(keep=3)),
    # probabilities 0.42, 0.25, 0.15, ...: 0.42 + 0.25 < 0.7 <= 0.42 + 0.25 + 0.15, so three tokens stay
    (SamplingParams(temperature=1.0, top_p=0.7), expected(keep=3)),
    (SamplingParams(temperature=1.0, top_p=5e-324), expected(keep=1)),  # rounds to 0: the most likely token only
])
def test_each_row_samples_the_distribution_it_asks_for(params, want):
    got = frequencies(params)
    # 4 standard deviations of a frequency over 20,000 draws, and nothing outside the kept tokens
    assert torch.all((got - want).abs() <= 4 * (want * (1 - want) / DRAWS).sqrt() + 1e-9), (got, want)


def test_a_seeded_row_gives_the_same_tokens_whatever_its_batch():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=1.3, top_k=7), SamplingParams(seed=9)]

    def draws(batch: bool) -> list[int]:
        gens = [torch.Generator().manual_seed(5), None, None, torch.Generator().manual_seed(9)]
        if batch:
            return [sample(logits, [seeded] + others, gens)[0] for _ in range(30)]
        return [sample(logits[:1], [seeded], gens[:1])[0] for _ in range(30)]

    alone = draws(batch=False)
    assert alone == draws(batch=True)
    assert len(set(alone)) > 1  # it does sample


def test_a_row_without_a_finite_logit_fails_alone():
    logits = torch.randn(3, 50)
    logits[1] = float("-inf")
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.7), SamplingParams(temperature=0)]
    tokens = sample(logits, params, [None] * 3)
    assert isinstance(tokens[1], Exception)
    assert isinstance(tokens[0], int) and 0 <= tokens[0] < 50
    assert tokens[2] == int(logits[2].argmax())
