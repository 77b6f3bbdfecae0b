"""Positions: the notes' sinusoidal numbers, learned lookup, RoPE against a complex-number reference."""

import math

import pytest
import torch

from lit_transformers.nn import LearnedPositions, RotaryEmbedding, SinusoidalPositions, absolute_positions


def test_sinusoidal_matches_notes_for_d_model_8():
    pe = SinusoidalPositions(max_len=3, d_model=8)(torch.arange(3)[None])[0]
    expected_prefix = torch.tensor(
        [[0.0, 1.0, 0.0, 1.0], [0.841, 0.540, 0.100, 0.995], [0.909, -0.416, 0.199, 0.980]]
    )
    torch.testing.assert_close(pe[:, :4], expected_prefix, atol=1e-3, rtol=0)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 4))


def test_sinusoidal_follows_the_formula():
    d = 10
    pe = SinusoidalPositions(50, d).table
    for pos in (0, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_learned_positions_look_up_rows_and_train():
    pos = LearnedPositions(6, 4)
    ids = torch.tensor([[3, 0, 5]])
    torch.testing.assert_close(pos(ids)[0], pos.weight[[3, 0, 5]])
    assert pos.weight.requires_grad and 0.01 < pos.weight.std().item() < 0.04


def _rope_reference(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE written as complex multiplication: (x_i + j x_{i+hs/2}) * exp(j pos theta_i)."""
    half = x.size(-1) // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.size(-1))
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rot = torch.polar(torch.ones_like(theta), positions.double()[..., None] * theta)  # (B, T, hs/2)
    out = z * rot[:, None]
    return torch.cat([out.real, out.imag], dim=-1)


def test_rope_matches_complex_rotation_reference():
    rope = RotaryEmbedding(head_dim=8, max_len=64)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 7, 40, 63]])
    torch.testing.assert_close(
        rope(x, positions).double(), _rope_reference(x, positions), atol=1e-5, rtol=1e-5
    )


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(head_dim=16, max_len=128)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(pq, pk):
        return (rope(q, torch.tensor([[pq]])) * rope(k, torch.tensor([[pk]]))).sum().item()

    assert score(10, 7) == pytest.approx(score(53, 50), abs=1e-4)
    assert score(10, 7) != pytest.approx(score(10, 9), abs=1e-3)
    torch.testing.assert_close(rope(q, torch.tensor([[0]])), q)  # position 0 is the identity


def test_absolute_positions_factory():
    assert isinstance(absolute_positions("learned", 8, 4), LearnedPositions)
    assert isinstance(absolute_positions("sinusoidal", 8, 4), SinusoidalPositions)
    assert absolute_positions("rope", 8, 4) is None
    with pytest.raises(ValueError, match="choose one of"):
        absolute_positions("alibi", 8, 4)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7, 8)
