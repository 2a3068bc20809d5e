"""Correctness shapes stay small enough to save and judge; the benchmark keeps live shapes."""

from gpuyantra.verifier.cases import CUDA_MAX_ELEMENTS, cap_elements, correctness_shapes


def test_huge_live_shape_is_capped_on_cuda_keeping_hidden_width():
    shapes = correctness_shapes("cuda", [[4096, 32768]])
    assert shapes[0] == [CUDA_MAX_ELEMENTS // 32768, 32768]


def test_small_live_shape_is_kept_and_leading_dim_never_zero():
    assert correctness_shapes("cuda", [[7, 1536]])[0] == [7, 1536]
    assert cap_elements([8, 2**25], CUDA_MAX_ELEMENTS) == [1, 2**25]
