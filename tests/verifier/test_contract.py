"""Layer 2, the deployment contract: ADAPTER against a meta-device instance, entry's signature."""

from __future__ import annotations

import pytest

from gpuyantra.verifier import verify
from gpuyantra.verifier.contract import check_contract
from gpuyantra.verifier.static import check_source
from tests.verifier.conftest import HEADER, HONEST_ENTRY, rules_of

GOOD_ADAPTER = (
    'ADAPTER = [\n    {"kernel_param": "weight", "module_attr": "weight"},\n'
    '    {"kernel_param": "eps", "module_attr": "variance_epsilon"},\n]'
)


def contract_rules(source: str, module_class: str | None = None) -> set[str]:
    result = check_contract(check_source(source), module_class)
    assert all(f.layer == "contract" and f.message for f in result.failures)
    return {f.rule for f in result.failures}


def with_adapter(adapter: str, entry: str = HONEST_ENTRY, op: str = 'OP = "rms_norm"') -> str:
    return HEADER.replace(GOOD_ADAPTER, adapter).replace('OP = "rms_norm"', op) + entry


CASES = [
    ("unknown-op", with_adapter(GOOD_ADAPTER, op='OP = "rms_normz"'), None),
    ("unknown-op", with_adapter(GOOD_ADAPTER, op="OP = 'rms' + '_norm'"), None),
    ("adapter-invalid", with_adapter('ADAPTER = [{"kernel_param": "weight"}]'), None),
    ("adapter-invalid", with_adapter('ADAPTER = [dict(kernel_param="weight", module_attr="weight")]'), None),
    (
        "adapter-params",
        with_adapter(
            'ADAPTER = [{"kernel_param": "gamma", "module_attr": "weight"},'
            ' {"kernel_param": "eps", "module_attr": "variance_epsilon"}]'
        ),
        None,
    ),
    ("adapter-params", with_adapter('ADAPTER = [{"kernel_param": "weight", "module_attr": "weight"}]'), None),
    (
        "adapter-attr",
        with_adapter(
            'ADAPTER = [{"kernel_param": "weight", "module_attr": "weight"},'
            ' {"kernel_param": "eps", "module_attr": "epsilon"}]'
        ),
        None,
    ),
    (
        "adapter-attr",
        with_adapter(
            'ADAPTER = [{"kernel_param": "weight", "module_attr": "variance_epsilon"},'
            ' {"kernel_param": "eps", "module_attr": "weight"}]'
        ),
        None,
    ),
    ("module-class", with_adapter(GOOD_ADAPTER), "gpuyantra.no_such_module.Norm"),
    ("module-class", with_adapter(GOOD_ADAPTER), "json.JSONDecoder"),
    ("entry-signature", with_adapter(GOOD_ADAPTER, entry="def entry(x, weight, eps):\n    return x\n"), None),
    ("entry-signature", with_adapter(GOOD_ADAPTER, entry="def entry(x, *, weight):\n    return x\n"), None),
    ("entry-signature", with_adapter(GOOD_ADAPTER, entry="def entry(x, *, weight, eps, scale):\n    return x\n"), None),
    ("entry-signature", with_adapter(GOOD_ADAPTER, entry="def helper(x):\n    return x\n"), None),
    ("entry-signature", with_adapter(GOOD_ADAPTER, entry=HONEST_ENTRY + HONEST_ENTRY), None),
]


@pytest.mark.parametrize("rule,source,module_class", CASES)
def test_contract_rule(rule, source, module_class):
    assert rule in contract_rules(source, module_class)


def test_same_kernel_binds_to_another_norm_class_through_adapter():
    source = with_adapter(GOOD_ADAPTER)
    assert contract_rules(source, "transformers.models.llama.modeling_llama.LlamaRMSNorm") == set()
    # torch.nn.RMSNorm calls its epsilon `eps`: the variance_epsilon binding does not fit it ...
    assert "adapter-attr" in contract_rules(source, "torch.nn.RMSNorm")
    # ... and a torch.nn.LayerNorm has no variance_epsilon either (checked on a meta instance).
    assert "adapter-attr" in contract_rules(source, "torch.nn.LayerNorm")


def test_parameter_specs_come_from_a_real_instance():
    result = check_contract(check_source(with_adapter(GOOD_ADAPTER)))
    assert result.failures == []
    assert result.param_specs == [
        {"name": "weight", "kind": "tensor", "shape": ["H"]},
        {"name": "eps", "kind": "float", "value": 1e-6},
    ]


def test_contract_failure_through_verify_runs_nothing(write_candidate):
    verdict = verify(
        write_candidate(
            with_adapter(
                'ADAPTER = [{"kernel_param": "weight", "module_attr": "w"},'
                ' {"kernel_param": "eps", "module_attr": "variance_epsilon"}]'
            ),
            whole=True,
        )
    )
    assert not verdict.accepted and verdict.reward == -1
    assert ("contract", "adapter-attr") in rules_of(verdict)
    assert verdict.checks == 0 and verdict.network_isolated is None


def test_unknown_op_through_verify_is_a_clear_rejection(write_candidate):
    verdict = verify(write_candidate(with_adapter(GOOD_ADAPTER, op='OP = "warp_drive"'), whole=True))
    assert rules_of(verdict) >= {("contract", "unknown-op")}
    message = next(f.message for f in verdict.failures if f.rule == "unknown-op")
    assert "warp_drive" in message and "rms_norm" in message  # names the known ops
