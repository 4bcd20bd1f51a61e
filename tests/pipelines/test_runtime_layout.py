"""The runtime's kernel call in the BNHD layout: same values as the BHND call, output a BHND view of BNHD memory."""
import pytest
import torch

import rotvid.kernels as kernels
from rotvid.pipelines.runtime import attention_into_bnhd


@pytest.mark.parametrize("recipe", ["int8-fp8", "int4", "fp16"])
def test_attention_into_bnhd_equals_bhnd_call_and_flattens_without_copy(recipe):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 67, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    opts = dict(recipe=recipe, backend="reference", layout="BHND", smooth_k=True)
    want = kernels.attention(q, k, v, **opts)
    got = attention_into_bnhd(q, k, v, **opts)
    assert got.shape == want.shape
    assert torch.equal(got, want)
    merged = got.transpose(1, 2)  # what the processors do before flatten(2, 3)
    assert merged.is_contiguous(), "BNHD memory: the processors' flatten is a view"
    assert merged.flatten(2, 3).data_ptr() == got.data_ptr()
