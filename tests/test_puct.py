"""Tests of puct.py: the archive and the PUCT rule, on hand-checked archives."""
import pytest

from puct import Archive, Child


def three_nodes():
    """seed (r=1.0) expanded once into a (r=2.0) and b (r=1.5)."""
    ar = Archive(c=1.0, keep_children=2)
    ar.add_seed("seed", "S", 1.0)
    ar.expand("seed", [Child("a", "A", 2.0), Child("b", "B", 1.5)])
    return ar


def test_rank_prior_sums_to_one_and_is_linear_in_rank():
    ar = three_nodes()
    prior = ar.rank_prior()
    assert sum(prior.values()) == pytest.approx(1.0)
    # N = 3, ranks a=0, b=1, seed=2; weights 3, 2, 1 over a total of 6.
    assert prior == pytest.approx({"a": 3 / 6, "b": 2 / 6, "seed": 1 / 6})


def test_puct_scores_on_a_three_node_archive_match_hand_computation():
    ar = three_nodes()
    # T = 1 expansion; scale = max - min over non-seed rewards = 2.0 - 1.5 = 0.5; sqrt(1 + T) = sqrt 2.
    # a:    Q = r = 2.0 (unvisited)          bonus = 1 * 0.5 * (3/6) * sqrt2 / (1 + 0) = 0.353553
    # b:    Q = r = 1.5 (unvisited)          bonus = 1 * 0.5 * (2/6) * sqrt2 / (1 + 0) = 0.235702
    # seed: Q = best child = 2.0 (n = 1)     bonus = 1 * 0.5 * (1/6) * sqrt2 / (1 + 1) = 0.058926
    assert ar.scale() == pytest.approx(0.5)
    assert ar.scores() == pytest.approx({"a": 2.353553, "b": 1.735702, "seed": 2.058926}, abs=1e-6)
    # a wins; the seed is a's ancestor, so it is blocked; b (a's sibling) is not.
    assert ar.select(2) == ["a", "b"]
    assert ar.select(1) == ["a"]


def test_scale_defaults():
    ar = Archive()
    ar.add_seed("seed", "S", 1.0)
    assert ar.scale() == 1.0  # no non-seed node yet
    ar.expand("seed", [Child("a", "A", 3.0)])
    assert ar.scale() == 1e-6  # one non-seed reward: zero range, floored


def test_bonus_decays_with_visits_and_grows_with_expansions_elsewhere():
    ar = three_nodes()
    bonus_a, bonus_b = [], []
    for _ in range(4):
        s = ar.scores()
        bonus_a.append(s["a"] - ar.nodes["a"].q())
        bonus_b.append(s["b"] - ar.nodes["b"].q())
        ar.expand("a", [])  # a's children all failed: a visit, no child
    assert all(x > y for x, y in zip(bonus_a, bonus_a[1:]))
    assert all(x < y for x, y in zip(bonus_b, bonus_b[1:]))  # b never visited, T grows
    assert ar.nodes["a"].visits == 4 and ar.nodes["a"].best_child is None
    assert ar.nodes["a"].q() == 2.0  # visited but childless: Q falls back to its own reward


def test_back_propagation_of_visits_and_best_child():
    ar = three_nodes()
    kept = ar.expand("a", [Child("a1", "A1", 5.0), Child("a2", "A2", 0.5)])
    assert kept == ["a1", "a2"]
    assert (ar.nodes["a"].visits, ar.nodes["seed"].visits, ar.nodes["b"].visits) == (1, 2, 0)
    assert ar.expansions == 2
    assert ar.nodes["a"].best_child == 5.0 and ar.nodes["a"].q() == 5.0  # max, not mean
    assert ar.nodes["seed"].best_child == 2.0  # only the expanded parent's value changes
    ar.expand("a", [Child("a3", "A3", 1.0)])
    assert ar.nodes["a"].best_child == 5.0  # max(old, new)


def test_lineage_blocking_never_picks_two_nodes_of_one_line():
    ar = three_nodes()
    ar.expand("a", [Child("a1", "A1", 9.0)])
    ar.expand("a1", [Child("a11", "A11", 10.0)])
    for k in (2, 3, 5):
        picked = ar.select(k)
        for i, x in enumerate(picked):
            for y in picked[i + 1:]:
                assert y not in ar.ancestors(x) | ar.descendants(x)
    assert len(ar.select(5)) == 2  # one node from the a-line plus b; the seed is everyone's ancestor


def test_top_k_children_and_exact_duplicates():
    ar = Archive(keep_children=2)
    ar.add_seed("seed", "S\n", 1.0)
    kept = ar.expand("seed", [Child("c1", "C1", 3.0), Child("c2", "C2", 5.0), Child("c3", "C3", 4.0),
                              Child("dup", "S", 9.0), Child("dup2", "C2", 6.0)])
    # "S" duplicates the seed's code, "C2" a sibling's: both dropped before the top-2 cut.
    assert kept == ["c2", "c3"]
    assert set(ar.nodes) == {"seed", "c2", "c3"}
    assert ar.nodes["seed"].best_child == 5.0


def test_capacity_keeps_seeds_then_best_rewards():
    ar = Archive(capacity=3, keep_children=10)
    ar.add_seed("seed", "S", 0.1)  # the worst reward, still kept
    ar.expand("seed", [Child(f"c{i}", f"C{i}", float(i)) for i in range(1, 5)])
    assert set(ar.nodes) == {"seed", "c4", "c3"}
    assert sorted(ar.nodes["seed"].children) == ["c3", "c4"]
