"""Every worker reply goes through one parser: wrong types, out-of-range numbers and missing
fields are Malformed with the field's path, never an exception of another kind."""

from __future__ import annotations

import math

import pytest

from kernforge.verifier import messages as M

GOOD_REF = {"offset": 512, "dtype": "bfloat16", "shape": [2, 3], "strides": [3, 1]}


def checked(**over):
    data = {"op": "check", "ok": True, "types": ["torch.Tensor"], "outputs": [dict(GOOD_REF)], "signals": {},
            "claimed_s": 0.01}
    data.update(over)
    return data


def test_a_good_reply_parses_into_records():
    reply = M.parse(M.Checked, checked(signals={"torch_ops": {"aten::add": 2}, "l2_persisting_limit": None}))
    assert reply.outputs[0] == M.TensorRef(**GOOD_REF)
    assert reply.signals.torch_ops == {"aten::add": 2}
    assert reply.outputs[0].span == 12 and reply.outputs[0].numel == 6


@pytest.mark.parametrize("field, value, words", [
    ("claimed_s", [1.0], "not a number"),
    ("claimed_s", float("nan"), "not a finite number"),
    ("claimed_s", -1.0, "outside"),
    ("claimed_s", True, "not a number"),
    ("types", "torch.Tensor", "not a list"),
    ("types", [7], "not a string"),
    ("outputs", [{**GOOD_REF, "offset": True}], "not an integer"),
    ("outputs", [{**GOOD_REF, "offset": -8}], "outside"),
    ("outputs", [{**GOOD_REF, "dtype": "float128"}], "not one of"),
    ("outputs", [{**GOOD_REF, "shape": [1] * 40, "strides": [1] * 40}], "items"),
    ("outputs", [{**GOOD_REF, "shape": 6}], "not a list"),
    ("signals", {"torch_ops": {"aten::add": "2"}}, "not an integer"),
    ("signals", {"l2_persisting_limit": -1}, "outside"),
    ("ok", "yes", "not a boolean"),
    ("signals", [], "not an object"),
    ("ok", 1, "not a boolean"),
    ("op", "time", "expected 'check'"),
])
def test_wrong_types_and_ranges_are_malformed(field, value, words):
    with pytest.raises(M.Malformed) as err:
        M.parse(M.Checked, checked(**{field: value}))
    assert words in str(err.value)
    assert "Checked." in str(err.value)


def test_missing_fields_and_non_objects_are_malformed():
    data = checked()
    del data["outputs"]
    with pytest.raises(M.Malformed, match="outputs is missing"):
        M.parse(M.Checked, data)
    for junk in ([], "reply", 3, None):
        with pytest.raises(M.Malformed, match="not an object"):
            M.parse(M.Checked, junk)


def test_a_failure_reply_is_told_apart():
    got = M.failure_or(M.Checked, {"op": "check", "ok": False, "stage": "runtime", "error": "boom"})
    assert isinstance(got, M.Failure) and got.stage == "runtime"
    with pytest.raises(M.Malformed):
        M.failure_or(M.Checked, {"op": "check", "ok": False, "stage": "verdict: accepted"})


def test_tensor_refs_say_why_they_cannot_be_read():
    ref = M.TensorRef(offset=6, dtype="float32", shape=[4], strides=[1])
    assert "multiple" in ref.problem(1 << 20)
    ref = M.TensorRef(offset=1 << 20, dtype="float32", shape=[4], strides=[1])
    assert "outside" in ref.problem(1 << 20)
    assert M.TensorRef(offset=0, dtype="float32", shape=[0, 5], strides=[5, 1]).span == 0
    assert M.TensorRef(offset=0, dtype="float32", shape=[2, 2], strides=[1, 2]).problem(16) is None
    assert "strides" in M.TensorRef(offset=0, dtype="float32", shape=[2, 2], strides=[1]).problem(64)


def test_plain_argument_values_are_bounded():
    assert M.parse(M.Arg, {"value": [1, 2.5, True, None]}).value == [1, 2.5, True, None]
    deep: list = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(M.Malformed, match="too deeply"):
        M.parse(M.Arg, {"value": deep})


def test_nonfinite_only_where_allowed():
    verified = M.parse(M.BatchVerified, {"op": "verify_batch", "ok": True, "failed_call": -1, "max_abs_err": math.inf})
    assert verified.max_abs_err == math.inf
