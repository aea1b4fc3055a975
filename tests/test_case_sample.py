"""The case sampler: seeded and reproducible, every case legal, every variant covered, the split
sizes as asked, the committed GLA case file what its sampling section draws, and the sampling
section's errors named by key path."""
from pathlib import Path

import pytest
import yaml

from opgen.space import case_sample
from opgen.errors import SpecError, UsageError
from opgen.spec.expr import parse
from opgen.space.space import case_inputs, evaluate_params, is_legal, variants_for
from opgen.spec.spec import load_spec, sampled_cases_path

ROOT = Path(__file__).resolve().parents[1]
OP = "chunk_gla_fwd_o_gk"
COMMAND = f"opgen cases {OP}"


@pytest.fixture(scope="module")
def gla():
    return load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)


@pytest.fixture(scope="module")
def drawn(gla):
    return case_sample.sample_cases(gla)


def _with(spec, **changes):
    return spec.model_copy(update={"sampling": spec.sampling.model_copy(update=changes)})


def _sampled_rows(spec, sampled):
    included = len(spec.expand_cases("bench"))
    tune, *rest = sampled.parts.values()
    return tune[included:] + [r for part in rest for r in part]


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_cases(gla, drawn):
    again = case_sample.sample_cases(gla)
    assert case_sample.cases_text(gla, again, COMMAND) == case_sample.cases_text(gla, drawn, COMMAND)
    other = case_sample.sample_cases(gla, seed=gla.sampling.seed + 1)
    assert _sampled_rows(gla, other) != _sampled_rows(gla, drawn)


def test_the_committed_case_file_is_what_the_sampling_section_draws(gla, drawn):
    path = sampled_cases_path(gla, ROOT)
    assert path == ROOT / "specs" / "cases" / f"{OP}_users.yaml"
    assert path.read_text() == case_sample.cases_text(gla, drawn, COMMAND), f"run `{COMMAND}`"
    # the spec reads the parts back as case sets of its own, values and all
    for name, rows in drawn.parts.items():
        assert gla.expand_cases(name) == rows


SAMPLED_OPS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml")
                     if "sampling" in yaml.safe_load(p.read_text()))


def test_more_than_one_op_samples_its_users_shapes():
    assert {OP, "mamba3_mimo_bwd_fwd"} <= set(SAMPLED_OPS)


@pytest.mark.parametrize("op", SAMPLED_OPS)
def test_each_ops_committed_case_file_is_what_its_sampling_section_draws(op):
    # what `opgen cases OP --check` compares, for every op with a sampling section
    spec = load_spec(ROOT / "specs" / f"{op}.yaml", ROOT)
    sampled = case_sample.sample_cases(spec)
    path = sampled_cases_path(spec, ROOT)
    assert path.read_text() == case_sample.cases_text(spec, sampled, f"opgen cases {op}"), f"run `opgen cases {op}`"
    included = [r for name in spec.sampling.include for r in spec.expand_cases(name)]
    tune = sampled.parts[spec.sampling.part_names()[0]]
    assert tune[:len(included)] == included
    rows = tune[len(included):] + [r for name in spec.sampling.part_names()[1:] for r in sampled.parts.get(name, [])]
    assert all(case_sample.case_problem(spec, r) is None for r in rows)
    params = [evaluate_params(spec, case_inputs(spec, r)) for r in rows]
    for variant in variants_for(spec, spec.sampling.rendering):
        assert sum(is_legal(spec, variant, p) for p in params) >= spec.sampling.cover, variant.name


def test_mamba3_users_shapes_take_the_z_gate_in_about_half_whole_chunks_and_c_times_r_at_most_64():
    spec = load_spec(ROOT / "specs" / "mamba3_mimo_bwd_fwd.yaml", ROOT)
    names = spec.sampling.part_names()
    official = {tuple(sorted(r.items())) for n in ("official", "official_z") for r in spec.expand_cases(n)}
    rows = [r for n in names for r in spec.expand_cases(n) if tuple(sorted(r.items())) not in official]
    assert len(rows) >= spec.sampling.count
    z = [r.get("z_given", False) for r in rows]
    assert z == [r.get("mimo_z_given", False) for r in rows]  # the gate's two inputs together
    assert 0.3 < sum(z) / len(rows) < 0.7
    # upstream's TileLang kernel, the holdout's baseline, takes whole chunks of C * R <= 64 rows
    assert all(r["S"] % r["chunk_size"] == 0 and r["chunk_size"] * r["R"] <= 64 for r in rows)
    assert {r["dtype"] for r in rows} == {"bfloat16", "float16"}
    assert any(r["B"] != 4 or r["S"] != 2048 or r["H"] != 16 or r["G"] != 1 for r in spec.expand_cases(names[2]))


def test_every_case_is_legal_new_and_drawn_from_the_region(gla, drawn):
    rows = _sampled_rows(gla, drawn)
    assert all(case_sample.case_problem(gla, r) is None for r in rows)
    seen = [tuple(sorted(r.items())) for r in rows + gla.expand_cases("bench")]
    assert len(seen) == len(set(seen))
    values = gla.sampling.values
    for r in rows:
        assert 1 <= r["B"] <= 32 and r["K"] in values["K"].choices and r["dtype"] in ("bfloat16", "float16")
        assert r["H"] in values["H"].choices or r["H"] == 1  # the pin
    tails = [r for r in rows if r["T"] % r["chunk_size"]]
    assert 0 < len(tails) < len(rows)  # some tails, not all
    assert any(r["H"] == 1 for r in rows) and {r["use_exp2"] for r in rows} == {False, True}
    assert any(abs(r["scale"]) > 1 for r in rows)  # the big_scale key field is reached


def test_every_variant_of_the_rendering_is_legal_for_cover_cases(gla, drawn):
    params = [evaluate_params(gla, case_inputs(gla, r)) for r in _sampled_rows(gla, drawn)]
    for variant in variants_for(gla, gla.sampling.rendering):
        assert sum(is_legal(gla, variant, p) for p in params) >= gla.sampling.cover, variant.name


def test_the_split_sizes_follow_the_shares_and_the_parts_are_disjoint(gla, drawn):
    tune, measure, holdout = (drawn.parts[n] for n in gla.sampling.part_names())
    extra = gla.sampling.measure_extra
    total = len(_sampled_rows(gla, drawn)) - extra
    assert total >= gla.sampling.count
    assert len(holdout) == round(0.25 * total) and len(measure) == round(0.25 * total) + extra
    assert tune[:len(gla.expand_cases("bench"))] == gla.expand_cases("bench")  # the bench cases tune
    keys = [tuple(sorted(r.items())) for r in tune + measure + holdout]
    assert len(keys) == len(set(keys))
    small = case_sample.sample_cases(gla, count=8, holdout=0.5, measure=0.0, measure_extra=0)
    assert list(small.parts) == ["users_tune", "users_holdout"]  # no measure part asked for
    assert len(small.parts["users_holdout"]) == round(0.5 * len(_sampled_rows(gla, small)))


def test_extra_measure_cases_leave_the_tune_and_holdout_parts_as_drawn(gla, drawn):
    names = gla.sampling.part_names()
    without = case_sample.sample_cases(gla, measure_extra=0)
    more = case_sample.sample_cases(gla, measure_extra=gla.sampling.measure_extra + 5)
    for name in (names[0], names[2]):
        assert drawn.parts[name] == without.parts[name] == more.parts[name]
    # the measure part keeps its drawn cases first, then the extra ones, in draw order
    base = without.parts[names[1]]
    assert drawn.parts[names[1]][:len(base)] == base
    assert more.parts[names[1]][:len(drawn.parts[names[1]])] == drawn.parts[names[1]]
    assert len(more.parts[names[1]]) == len(base) + gla.sampling.measure_extra + 5
    added = more.parts[names[1]][len(base):]
    assert all(case_sample.case_problem(gla, r) is None for r in added)
    seen = {tuple(sorted(r.items())) for part in without.parts.values() for r in part}
    assert not seen & {tuple(sorted(r.items())) for r in added}


def test_a_short_draw_is_topped_up_for_the_variants_it_misses(gla):
    spec = _with(gla, pins=(), count=3, include=())
    spec = spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"values": {
        **spec.sampling.values, "H": spec.sampling.values["H"].model_copy(update={"choices": (1, 2, 4, 8, 16, 32, 64)})}})})
    sampled = case_sample.sample_cases(spec)
    assert any(v.endswith(("h1_tiled", "h1_persistent")) for v in sampled.topped_up)
    rows = [r for part in sampled.parts.values() for r in part]
    assert len(rows) > 3
    params = [evaluate_params(spec, case_inputs(spec, r)) for r in rows]
    for variant in variants_for(spec, "cuda"):
        assert sum(is_legal(spec, variant, p) for p in params) >= 2, variant.name
    assert case_sample.sample_cases(spec) == sampled


def test_a_variant_the_region_never_reaches_is_an_error_naming_it(gla):
    spec = _with(gla, pins=(), count=4, include=())  # H is never 1: the h1 variants are out of reach
    with pytest.raises(SpecError, match=r"sampling: expected a region where variant \w+_h1_\w+ \(legal when"):
        case_sample.sample_cases(spec)


def test_a_region_the_checks_refuse_is_an_error(gla):
    spec = _with(gla, limit=parse("B < 0"), include=())
    with pytest.raises(SpecError, match="draws in a row pass the spec's checks"):
        case_sample.sample_cases(spec)
    with pytest.raises(UsageError, match="holdout \\+ measure below 1"):
        case_sample.sample_cases(gla, holdout=0.5, measure=0.5)
    with pytest.raises(UsageError, match="--measure-extra -1: .*0 to 10000 extra"):
        case_sample.sample_cases(gla, measure_extra=-1)


def _load_with(tmp_path, change):
    data = yaml.safe_load((ROOT / "specs" / f"{OP}.yaml").read_text())
    change(data["sampling"])
    path = tmp_path / "specs" / f"{OP}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path, tmp_path)


@pytest.mark.parametrize("change, where, expected", [
    (lambda s: s["values"].update(B={"choices": [1], "log_range": [1, 2]}), "sampling.values.B",
     "exactly one of choices and log_range"),
    (lambda s: s["values"].update(T={"log_range": [0, 2]}), "sampling.values.T", "1 <= low <= high"),
    (lambda s: s["values"].update(dtype={"log_range": [1, 2]}), "sampling.values.dtype.log_range",
     "an int input"),
    (lambda s: s["values"].update(K={"choices": [64, "wide"]}), "sampling.values.K.choices.1", "a int value"),
    (lambda s: s["values"].pop("V"), "sampling.values", "a way to draw every dim"),
    (lambda s: s["values"].update(Q={"choices": [1]}), "sampling.values.Q", "a dim symbol, a scalar or dtype"),
    (lambda s: s["pins"].append({"share": 0.1, "values": {"W": 1}}), "sampling.pins.1.values.W",
     "a dim symbol"),
    (lambda s: s["pins"].append({"share": 1.5, "values": {"H": 1}}), "sampling.pins.1.share", "less than or equal"),
    (lambda s: s["tails"].update(symbol="H"), "sampling.tails.symbol", "an input drawn from a log_range"),
    (lambda s: s["tails"].update(multiple_of="dtype"), "sampling.tails.multiple_of", "an int input"),
    (lambda s: s.update(limit="B * NOPE < 3"), "sampling.limit", "formula names among"),
    (lambda s: s.update(include=["nope"]), "sampling.include.0", "a case set of the spec"),
    (lambda s: s.update(holdout=0.6, measure=0.4), "sampling", "holdout + measure below 1"),
    (lambda s: s.update(file="cases/../../x.yaml"), "sampling", "a file under the spec's folder"),
    (lambda s: s.update(colour="red"), "sampling.colour", "Extra inputs are not permitted"),
])
def test_sampling_section_errors_name_the_key_path(tmp_path, change, where, expected):
    with pytest.raises(SpecError) as err:
        _load_with(tmp_path, change)
    assert err.value.key_path == where and expected in str(err.value)


def test_a_case_file_that_clashes_or_is_no_mapping_is_refused(tmp_path):
    def write(text):
        (tmp_path / "specs" / "cases").mkdir(parents=True, exist_ok=True)
        (tmp_path / "specs" / "cases" / f"{OP}_users.yaml").write_text(text)

    write("bench: []\n")
    with pytest.raises(SpecError, match="no case set named like one of"):
        _load_with(tmp_path, lambda s: None)
    write("- {B: 1}\n")
    with pytest.raises(SpecError, match="a mapping of case set names to lists of cases"):
        _load_with(tmp_path, lambda s: None)
    write("users_tune:\n  - {B: 1, T: 64, H: 2, K: 32, V: 32, dtype: bfloat16}\n")
    assert _load_with(tmp_path, lambda s: None).expand_cases("users_tune")[0]["T"] == 64


def test_bench_set_forces_a_value_in_every_case_and_runs_repeats_once(gla):
    from opgen.cli.cli_bench import with_values

    rows = gla.expand_cases("users_holdout")
    forced = with_values(gla, rows, ["use_exp2=true"])
    assert forced and all(r["use_exp2"] is True for r in forced)  # FLA computes exp2 only
    assert len(forced) == len({tuple(sorted({**r, "use_exp2": True}.items())) for r in rows})
    assert [{k: v for k, v in r.items() if k != "use_exp2"} for r in forced] == \
        [{k: v for k, v in r.items() if k != "use_exp2"} for r in rows][:len(forced)]  # in case order
    twice = with_values(gla, rows + rows, ["use_exp2=true"])
    assert twice == forced
    with pytest.raises(UsageError, match="expected NAME=VALUE"):
        with_values(gla, rows, ["exp2=true"])


def test_opgen_cases_checks_writes_and_refuses_an_op_without_sampling(tmp_path, capsys):
    from opgen.cli import main as cli

    assert cli.main(["--root", str(ROOT), "cases", OP, "--check"]) == 0
    assert cli.main(["--root", str(ROOT), "cases", OP, "--seed", "15", "--check"]) == 1
    out = tmp_path / "other.yaml"
    assert cli.main(["--root", str(ROOT), "cases", OP, "--seed", "15", "--sample", "10", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(f"# Drawn by `opgen cases {OP} --sample 10 --seed 15` from the sampling section")
    assert yaml.safe_load(text)["users_holdout"]  # parts as case lists
    assert cli.main(["--root", str(ROOT / "tests" / "toy_project"), "cases", "toy_op"]) == 2
    assert "has no sampling section to draw cases from" in capsys.readouterr().err
