import pytest

from ingot.codegen.target import TARGETS, get_target


def test_known_targets():
    assert get_target("b200").arch == "sm_100a" and get_target("B200").tcgen05
    assert get_target("h200").arch == get_target("h100").arch == "sm_90a"
    assert get_target("h100").wgmma and not get_target("h100").tcgen05
    assert get_target("b200").fp4_tensor_cores and not get_target("h200").fp4_tensor_cores
    assert get_target("h200").hbm_bytes > get_target("h100").hbm_bytes
    assert not get_target("cpu").is_gpu
    for t in TARGETS.values():
        if t.is_gpu:
            assert t.num_sms > 0 and t.smem_per_block > 0 and t.hbm_bytes_per_s > 0
            assert t.arch_family in ("sm90", "sm100")


def test_unknown_target_lists_known_ones():
    with pytest.raises(ValueError, match="b200.*h200.*h100.*cpu"):
        get_target("a100")
