"""Memory-planning algorithms (qcc.plan) against brute force, nnabla's own planner, and
hand-checked worst cases."""

from __future__ import annotations

import itertools
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qcc.errors import UnsupportedError, UsageError
from qcc.plan import (
    FITS,
    ORDERS,
    SHARED_METHODS,
    ArenaPlan,
    Buffer,
    SharedPlan,
    conflicts,
    lb_offsets,
    lb_shared,
    naive_size,
    nnabla_shared_plan,
    plan_arena,
    plan_shared,
    positional_maxima,
    verify_arena,
    verify_shared,
)
from qcc.plan.arena import _branch_and_bound
from qcc.plan.bounds import positional_maxima_arrays
from qcc.plan.intervals import as_arrays, conflict_lists, conflict_pairs
from qcc.plan.shared import greedy_by_breadth, greedy_by_size_improved

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def buffer_sets(draw, max_n=12, max_start=12, max_len=6, max_size=40, min_size=0):
    rows = draw(
        st.lists(
            st.tuples(
                st.integers(min_size, max_size),
                st.integers(0, max_start),
                st.integers(0, max_len),
            ),
            max_size=max_n,
        )
    )
    return [Buffer(f"t{i}", s, f, f + n) for i, (s, f, n) in enumerate(rows)]


def live_profiles(bufs):
    """Sizes live at every step, largest first (the definition, step by step)."""
    if not bufs:
        return []
    steps = range(min(b.first for b in bufs), max(b.last for b in bufs) + 1)
    return [sorted((b.size for b in bufs if b.first <= t <= b.last), reverse=True) for t in steps]


def brute_maxima(bufs):
    out: list[int] = []
    for live in live_profiles(bufs):
        out += live[len(out) :]
        out[: len(live)] = [max(a, b) for a, b in zip(out, live)]
    return out


def first_fit_total(bufs, order):
    """Lowest-offset placement in the given order (independent of qcc.plan)."""
    off: dict[int, int] = {}
    for i in order:
        b = bufs[i]
        used = sorted(
            (off[j], off[j] + bufs[j].size)
            for j in off
            if bufs[j].first <= b.last and b.first <= bufs[j].last
        )
        top, at = 0, None
        for lo, hi in used:
            if at is None and lo - top >= b.size:
                at = top
            top = max(top, hi)
        off[i] = top if at is None else at
    return max((off[i] + bufs[i].size for i in off), default=0)


def opt_by_permutations(bufs):
    """Some optimum puts buffers, listed by offset, each at its lowest free offset: so the best
    first-fit over all orders is optimal."""
    return min(first_fit_total(bufs, p) for p in itertools.permutations(range(len(bufs))))


def opt_by_grid(bufs):
    """Every integer offset combination (tiny cases only)."""
    span = sum(b.size for b in bufs)
    best = span
    pairs = [
        (i, j)
        for i, j in itertools.combinations(range(len(bufs)), 2)
        if bufs[i].first <= bufs[j].last and bufs[j].first <= bufs[i].last
    ]
    for offs in itertools.product(*(range(span - b.size + 1) for b in bufs)):
        top = max((o + b.size for o, b in zip(offs, bufs)), default=0)
        if top >= best:
            continue
        if all(
            offs[i] + bufs[i].size <= offs[j] or offs[j] + bufs[j].size <= offs[i] for i, j in pairs
        ):
            best = top
    return best


# ---------------------------------------------------------------- bounds


@SETTINGS
@given(buffer_sets(max_n=20))
def test_bounds_match_their_definition(bufs):
    profiles = live_profiles(bufs)
    assert lb_offsets(bufs) == max((sum(p) for p in profiles), default=0)
    assert list(positional_maxima(bufs)) == brute_maxima(bufs)
    # the O(n log n) segment-tree path agrees with the clique expansion
    arr = as_arrays(bufs)
    assert positional_maxima_arrays(arr, pair_limit=0).tolist() == brute_maxima(bufs)
    assert naive_size(bufs) >= lb_shared(bufs) >= lb_offsets(bufs)


# ---------------------------------------------------------------- arena


@SETTINGS
@given(buffer_sets(), st.sampled_from([1, 4, 16]))
def test_every_arena_plan_verifies(bufs, alignment):
    plans = [plan_arena(bufs, alignment=alignment)]
    plans += [
        plan_arena(bufs, alignment=alignment, orders=(o,), fits=(f,), exact_limit=0)
        for o in ORDERS
        for f in FITS
    ]
    for plan in plans:
        assert verify_arena(bufs, plan) == []
        assert plan.total >= plan.lower_bound >= lb_offsets(bufs)
        assert plan.total % alignment == 0
    assert plans[0].total <= min(p.total for p in plans[1:])
    assert plans[0].optimal


@settings(max_examples=120, deadline=None)
@given(buffer_sets(max_n=6, max_start=6, max_len=4, max_size=12, min_size=1))
def test_branch_and_bound_equals_brute_force(bufs):
    # a single weak heuristic leaves the exact search something to do
    plan = plan_arena(bufs, orders=("first-use",), fits=("first-fit",))
    assert verify_arena(bufs, plan) == []
    assert plan.optimal
    assert plan.total == opt_by_permutations(bufs)


@st.composite
def tight_buffer_sets(draw):
    """Every step filled to exactly `height`: the instances where OPT can exceed LB_off."""
    height = draw(st.integers(2, 5))
    live: list[tuple[int, int, int]] = []
    rows: list[tuple[int, int, int]] = []
    for step in range(draw(st.integers(1, 5))):
        live = [r for r in live if r[2] >= step]
        load = sum(r[0] for r in live)
        while load < height and len(rows) < 7:
            size = draw(st.integers(1, height - load))
            row = (size, step, step + draw(st.integers(0, 2)))
            live.append(row)
            rows.append(row)
            load += size
    return [Buffer(f"t{i}", *r) for i, r in enumerate(rows)]


@settings(max_examples=150, deadline=None)
@given(tight_buffer_sets())
def test_exact_search_alone_finds_the_optimum(bufs):
    arr = as_arrays(bufs)
    upper = naive_size(bufs) + 1  # no heuristic incumbent: the search does all the work
    found, proved = _branch_and_bound(arr, conflict_lists(arr), lb_offsets(bufs), upper, 10.0)
    assert proved and found is not None
    plan = ArenaPlan(
        dict(zip(arr.names, found)),
        max(o + b.size for o, b in zip(found, bufs)),
        lb_offsets(bufs),
        "branch-and-bound",
        True,
    )
    assert verify_arena(bufs, plan) == []
    assert plan.total == opt_by_permutations(bufs)


def test_permutation_oracle_agrees_with_exhaustive_offsets():
    rng = np.random.default_rng(0)
    for _ in range(25):
        n = int(rng.integers(1, 5))
        bufs = []
        for i in range(n):
            f = int(rng.integers(0, 3))
            bufs.append(Buffer(f"t{i}", int(rng.integers(1, 4)), f, f + int(rng.integers(0, 3))))
        expected = opt_by_grid(bufs)
        assert opt_by_permutations(bufs) == expected
        assert plan_arena(bufs, orders=("first-use",), fits=("first-fit",)).total == expected


def test_optimum_above_load_is_proved():
    # Steps 0 and 1 force c,d into one aligned half of a 4-wide arena, steps 3 and 4 force c,e
    # into one half, so step 2 (c,d,e,f all live) cannot fit in 4: OPT = 5 > LB_off = 4.
    rows = [(2, 0, 1), (2, 0, 0), (1, 1, 3), (1, 1, 2), (1, 2, 3), (1, 2, 2), (2, 3, 4), (2, 4, 4)]
    bufs = [Buffer(n, *r) for n, r in zip("abcdefgh", rows)]
    plan = plan_arena(bufs)
    assert (plan.lower_bound, plan.total, plan.optimal) == (4, 5, True)
    assert verify_arena(bufs, plan) == []
    assert opt_by_permutations(bufs) == 5


def test_exact_search_respects_its_budget():
    rng = np.random.default_rng(1)
    for _ in range(200):  # a 40-buffer case the heuristics cannot close
        bufs = []
        for i in range(40):
            f = int(rng.integers(0, 40))
            bufs.append(Buffer(f"t{i}", int(rng.integers(1, 100)), f, f + int(rng.integers(0, 6))))
        if plan_arena(bufs, exact_limit=0).total > lb_offsets(bufs):
            break
    start = time.monotonic()
    plan = plan_arena(bufs, time_budget=0.3)
    assert time.monotonic() - start < 3.0
    assert verify_arena(bufs, plan) == []
    assert plan.total <= plan_arena(bufs, exact_limit=0).total


def test_alignment_pads_every_offset():
    bufs = [Buffer("a", 3, 0, 1), Buffer("b", 5, 1, 2), Buffer("c", 1, 2, 3)]
    plan = plan_arena(bufs, alignment=8)
    assert all(o % 8 == 0 for o in plan.offsets.values())
    assert (plan.lower_bound, plan.total, plan.alignment) == (16, 16, 8)
    assert verify_arena(bufs, plan) == []


# ---------------------------------------------------------------- shared objects


@SETTINGS
@given(buffer_sets(max_n=20))
def test_every_shared_plan_verifies(bufs):
    lower = lb_shared(bufs)
    plans = [plan_shared(bufs), nnabla_shared_plan(bufs)]
    plans += [plan_shared(bufs, methods=(m,)) for m in SHARED_METHODS]
    plans.append(plan_shared(bufs, methods=("greedy-size-improved",), dynamic_limit=0))
    peak_count = len(positional_maxima(bufs))
    for plan in plans:
        assert verify_shared(bufs, plan) == []
        assert plan.lower_bound == lower
        assert plan.total >= lower >= lb_offsets(bufs)
        assert len(plan.buffer_sizes) >= peak_count
    assert plans[0].total <= min(p.total for p in plans[2:])
    assert plans[-1].method == ("greedy-size-improved-static" if bufs else "greedy-size-improved")


def breadth_reference(bufs):
    """TFLite GPU GreedyByBreadthAssignment written out literally: every step's profile, steps
    by decreasing breadth (ties: earlier step), tensors by decreasing size (ties: input order)."""
    ids: list[int | None] = [None] * len(bufs)
    sizes: list[int] = []
    schedules: list[list[Buffer]] = []
    steps = range(min(b.first for b in bufs), max(b.last for b in bufs) + 1)
    profile = {t: [i for i, b in enumerate(bufs) if b.first <= t <= b.last] for t in steps}
    breadth = {t: sum(bufs[i].size for i in profile[t]) for t in steps}
    for t in sorted(steps, key=lambda t: (-breadth[t], t)):
        for i in sorted(profile[t], key=lambda i: (-bufs[i].size, i)):
            if ids[i] is not None:
                continue
            need, best = bufs[i].size, None
            for o, cur in enumerate(sizes):
                if best is not None:
                    if sizes[best] < need:
                        if cur <= sizes[best]:
                            continue
                    elif cur < need or cur >= sizes[best]:
                        continue
                if not any(conflicts(bufs[i], other) for other in schedules[o]):
                    best = o
            if best is None:
                best = len(sizes)
                sizes.append(need)
                schedules.append([])
            schedules[best].append(bufs[i])
            sizes[best] = max(sizes[best], need)
            ids[i] = best
    return ids


def size_dist_reference(bufs):
    """TFLite GPU GreedyBySizeDistPriorityAssignment written out literally (O(n^2))."""
    inf = float("inf")
    maxima = brute_maxima(bufs)
    n = len(bufs)
    position = [sum(m >= b.size for m in maxima) - 1 for b in bufs]
    dist: list[list[float]] = [[] for _ in bufs]
    best_dist, best_obj = [inf] * n, [0] * n
    ids: list[int | None] = [None] * n
    objects = 0

    def gap(a, b):
        if a.last < b.first:
            return b.first - a.last
        return a.first - b.last if b.last < a.first else inf

    for _ in range(n):
        open_ = [i for i in range(n) if ids[i] is None]
        b = min(open_, key=lambda i: (position[i], best_dist[i], -bufs[i].size, i))
        new = best_dist[b] == inf
        obj = objects if new else best_obj[b]
        objects += new
        ids[b] = obj
        for r in open_:
            if r == b or (not new and dist[r][obj] == inf):
                continue
            d = gap(bufs[r], bufs[b])
            if new:
                dist[r].append(d)
            elif d == inf:
                dist[r][obj] = inf
                if best_obj[r] == obj:
                    best_dist[r] = inf
                    for o, x in enumerate(dist[r]):
                        if x < best_dist[r]:
                            best_dist[r], best_obj[r] = x, o
            else:
                dist[r][obj] = min(dist[r][obj], d)
            if d < best_dist[r]:
                best_dist[r], best_obj[r] = d, obj
    return ids


@SETTINGS
@given(buffer_sets(max_n=16))
def test_shared_greedies_match_their_literal_definitions(bufs):
    arr = as_arrays(bufs)
    if bufs:
        assert greedy_by_breadth(arr) == breadth_reference(bufs)
    maxima = positional_maxima_arrays(arr)
    assert greedy_by_size_improved(arr, maxima) == size_dist_reference(bufs)


def nnabla_reference(bufs, num_functions):
    """Run nnabla's own save_variable_buffer on a stand-in for its converter `info`: function
    f outputs the buffers that start at f and takes those that end at f; buffers whose last
    step is num_functions are graph outputs (nnabla extends them to the end itself)."""
    svb = pytest.importorskip("nnabla.utils.converter.nnablart.save_variable_buffer")
    ns = types.SimpleNamespace
    functions = [ns(input=[], output=[]) for _ in range(num_functions)]
    for b in bufs:
        functions[b.first].output.append(b.name)
        if b.first < b.last < num_functions:
            functions[b.last].input.append(b.name)
    info = ns(
        _network=ns(variable=[ns(name=b.name, type="Buffer") for b in bufs], function=functions),
        _variable_buffer_index={i: [i] for i in range(len(bufs))},
        _buffer_ids={i: i for i in range(len(bufs))},
        _variable_buffer_size={i: b.size for i, b in enumerate(bufs)},
        _generator_variables={},
        _input_variables=[],
        _output_variables=[b.name for b in bufs if b.last >= num_functions],
    )
    sizes, var_to_buf = svb.save_variable_buffer(info)
    return [int(s) for s in sizes], {bufs[v].name: int(k) for v, k in var_to_buf.items()}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 9), st.integers(0, 5)), min_size=1, max_size=25
    )
)
def test_nnabla_policy_matches_nnabla(rows):
    functions = 10
    bufs = [Buffer(f"v{i}", s, f, min(functions, f + n)) for i, (s, f, n) in enumerate(rows)]
    sizes, assignment = nnabla_reference(bufs, functions)
    plan = nnabla_shared_plan(bufs)
    assert list(plan.buffer_sizes) == sizes
    assert plan.assignment == assignment
    assert plan.total == sum(sizes)


def test_nnabla_policy_grows_a_buffer_when_nothing_vacant_fits():
    # positional maxima (5, 3) -> buffers [3, 5]; q takes 0, p takes 1, then r (5) finds only
    # buffer 0 vacant and grows it: nnabla pays 10 where LB_so is 8.
    bufs = [Buffer("q", 2, 0, 0), Buffer("p", 3, 0, 1), Buffer("r", 5, 1, 1)]
    plan = nnabla_shared_plan(bufs)
    assert plan.buffer_sizes == (5, 5)
    assert plan.assignment == {"q": 0, "p": 1, "r": 0}
    assert (plan.total, plan.lower_bound) == (10, 8)
    assert plan_shared(bufs).total == 8


# ---------------------------------------------------------------- verifiers


def test_verifiers_report_every_problem():
    bufs = [Buffer("a", 4, 0, 1), Buffer("b", 4, 1, 2), Buffer("c", 4, 3, 3)]
    arena = ArenaPlan({"a": 0, "b": 2, "x": 0}, 7, 8, "hand", False, 1)
    problems = verify_arena(bufs, arena)
    assert any("'c' has no offset" in p for p in problems)
    assert any("unknown tensor 'x'" in p for p in problems)
    assert any("'a'" in p and "'b'" in p and "overlap" in p for p in problems)
    assert any("total 7 != 6" in p for p in problems)
    assert any("total 7 is below the lower bound 8" in p for p in problems)
    misaligned = ArenaPlan({"a": 0, "b": 4, "c": 0}, 16, 16, "hand", False, 8)
    assert any("not a multiple of 8" in p for p in verify_arena(bufs, misaligned))

    shared = SharedPlan({"a": 0, "b": 0, "c": 2}, (3, 4), 9, 8, "hand")
    problems = verify_shared(bufs, shared)
    assert any("does not fit buffer 0" in p for p in problems)
    assert any("share buffer 0" in p for p in problems)
    assert any("uses buffer 2, only 2 exist" in p for p in problems)
    assert any("total 9 != sum of buffer sizes 7" in p for p in problems)
    good = SharedPlan({"a": 0, "b": 1, "c": 0}, (4, 4), 8, 8, "hand")
    assert verify_shared(bufs, good) == []


def test_invalid_buffers_are_usage_errors():
    with pytest.raises(UsageError, match=r"'x'.*negative size"):
        Buffer("x", -1, 0, 0)
    with pytest.raises(UsageError, match=r"'y'.*ends before it starts"):
        Buffer("y", 1, 3, 2)
    with pytest.raises(UsageError, match="duplicate buffer names: 'z'"):
        plan_arena([Buffer("z", 1, 0, 0), Buffer("z", 1, 1, 1)])
    with pytest.raises(UsageError, match="unknown order 'random'"):
        plan_arena([], orders=("random",))
    with pytest.raises(UsageError, match="alignment"):
        plan_arena([], alignment=0)
    clique = as_arrays([Buffer(f"c{i}", 1, 0, 1) for i in range(6)])
    with pytest.raises(UnsupportedError, match="6 buffers have 15 pairs"):
        conflict_pairs(clique, limit=14)


# ---------------------------------------------------------------- worst cases and scale


def test_degenerate_inputs():
    assert plan_arena([]).total == 0 and plan_shared([]).total == 0
    assert nnabla_shared_plan([]).buffer_sizes == ()
    zero = [Buffer("a", 0, 0, 5), Buffer("b", 7, 0, 5)]
    for plan in (plan_arena(zero), plan_shared(zero), nnabla_shared_plan(zero)):
        assert plan.total == 7


def test_all_overlapping_and_nested_lifetimes_meet_the_bounds():
    rng = np.random.default_rng(2)
    clique = [Buffer(f"c{i}", int(rng.integers(1, 1000)), 0, 10) for i in range(300)]
    nested = [Buffer(f"n{i}", int(rng.integers(1, 1000)), i, 600 - i) for i in range(300)]
    for bufs in (clique, nested):
        arena, shared = plan_arena(bufs), plan_shared(bufs)
        assert verify_arena(bufs, arena) == [] and verify_shared(bufs, shared) == []
        assert arena.total == lb_offsets(bufs) == naive_size(bufs)
        assert shared.total == lb_shared(bufs) == naive_size(bufs)


def chain_with_skips(n, seed):
    """Op i makes tensor i, consumed by op i+1 and sometimes by a later op (residuals)."""
    rng = np.random.default_rng(seed)
    sizes = (rng.lognormal(11, 1.2, n)).astype(np.int64) + 1
    reach = np.where(rng.random(n) < 0.1, rng.integers(2, 12, n), 1)
    return [Buffer(f"t{i}", int(sizes[i]), i, i + int(reach[i])) for i in range(n)]


def test_fifty_thousand_buffers_plan_quickly():
    bufs = chain_with_skips(50_000, seed=3)
    start = time.monotonic()
    arena = plan_arena(bufs)
    middle = time.monotonic()
    shared = plan_shared(bufs)
    end = time.monotonic()
    assert verify_arena(bufs, arena) == [] and verify_shared(bufs, shared) == []
    assert arena.total <= 1.1 * arena.lower_bound
    assert shared.total <= 1.2 * shared.lower_bound
    # measured about 1 s each on the 2-core CI box; the bound only catches complexity blow-ups
    assert middle - start < 15 and end - middle < 15
