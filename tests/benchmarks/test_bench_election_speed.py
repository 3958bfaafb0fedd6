def test_quick_benchmark_runs_and_agrees_with_plain_rule():
    from benchmarks.election_speed import main  # imported here: collection stays fast

    doc = main(["--quick", "--repeats", "1"])
    assert all(r["masks_equal"] for r in doc["speed"])
    assert [m["sites"] for m in doc["tally_memory"]] == [3, 30]
    # O(d) memory: ten times the sites may not cost anything like ten times the memory
    assert doc["memory_ratio"] < 2.0
    assert [(b["rows"], b["features"]) for b in doc["site_ballot"]] == [(60, 2_000), (300, 2_000)]
    assert all(b["ballot_s"] > 0 for b in doc["site_ballot"])


def test_plain_rule_reference_is_the_rule():
    import numpy as np

    from benchmarks.election_speed import plain_numpy_rule

    masks = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], dtype=bool)
    scores = np.array([[1.0, 0.9, 0.2, 0.1, 0.0], [1.0, 0.6, 0.8, 0.2, 0.0], [1.0, 0.3, 0.6, 0.4, 0.0]])
    assert plain_numpy_rule(masks, scores, np.array([50, 30, 20]), 0.4).tolist() == [True, True, True, False, False]
