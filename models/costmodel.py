"""costmodel.py: a learned cost model as the forecaster, the field's older answer to the paper's question.

The paper asks whether an LLM can stand in for the GPU. Before LLMs, tuners answered the same need
with a learned cost model: TVM's Ansor fits gradient-boosted trees on features of each candidate
and refits them online as its search measures more (TLP and the TPU learned performance model
followed). This module is that surrogate behind the forecaster's interface: it forecasts the same
`Forecast` (8 bin probabilities, the confidence the gate reads), so the gate, the search,
metrics.py and eval_set.py take it unchanged, and it trains in seconds on a CPU.

    features        costmodel_features.pair_features: numbers read off the (anchor, candidate)
                    source, the task and the hardware profile, never by running the code
    CostModel       an ensemble of gradient-boosted regressors of log2(speedup), turned into bin
                    probabilities by a normal distribution whose width is calibrated on held-out
                    rows; trained by train_costmodel.py, saved to and loaded from a folder
    CostModelForecaster   forecast_many / forecast_pairs like forecaster.Forecaster; offline over
                    a saved model (forecaster.py --costmodel DIR), or online (search.py
                    --forecaster costmodel): refit on the search's own measured kernels before
                    each forecast that has new labels, deferring every child to measurement until
                    it has min_labels of them

The model, step by step:
  - target: log2 S of each row (S the measured speedup), clipped to LOG2_RANGE: beyond it every
    value falls in bin 1 or bin 8 alike, and one wild measurement should not pull the trees.
  - ENSEMBLE boosters, each on its own bagging of the rows and features (its own seed). Ansor fits
    one booster with a ranking loss, which is all a search that only ranks needs; a forecast needs
    a distribution, and the ensemble's disagreement (spread) says where the trees know little.
  - forecast: log2 S ~ N(mu, sigma^2), mu the ensemble's mean, sigma = sqrt(a^2 + (b * spread)^2),
    integrated over each bin's log2 interval (the open bins take the tails); probabilities are
    floored at PROB_FLOOR, so no bin is ever impossible. The max-prob confidence is then high
    where the ensemble agrees and its mean sits inside a bin, low near an edge or where it
    disagrees.
  - calibration on held-out rows: out-of-fold forecasts (FOLDS folds; rows with the same candidate
    code stay in one fold, so no kernel is scored by trees that saw it) fix a and b by the log
    score of the true bins over a grid. The report scores the out-of-fold forecasts three ways:
    uniform, uncalibrated (sigma = the spread alone) and calibrated, each fold with (a, b) fitted
    on the other folds only, so the calibrated figures are held out twice over. The final model
    is refit on every row with the (a, b) of all out-of-fold rows.

Why LightGBM, not XGBoost: both are well kept gradient-boosting libraries with the same trees for
this purpose (histogram split finding, L2 leaves, row and feature bagging). LightGBM's wheel is a
few MB, CPU only, depending on numpy and scipy, which the project already has; XGBoost's Linux
wheel is ~130 MB and pulls NVIDIA's NCCL (~200 MB more) into every CPU-only install. LightGBM with
`deterministic=True` on one thread gives the same model for the same rows and seed, which a
search's replay and the tests rely on, and it trains a few hundred rows in well under a second.

On CPU, labels are CPU times of Triton kernels run by its interpreter: a model trained on them
learns the interpreter, not a GPU. Every figure made from such rows says so.
"""
import json
import math
import os
import shutil
import time
import zlib
from pathlib import Path

import numpy as np

import bins
import selective
from forecast_answer import Forecast
from forecast_prompt import row_hardware
from models.costmodel_features import FEATURE_VERSION, feature_names, pair_features

ENSEMBLE = 5
ROUNDS = 150
FOLDS = 5
MIN_ROWS = 8            # train_costmodel.py's least rows
ONLINE_MIN_LABELS = 5   # search.py --costmodel-min-labels: measured kernels before the model gates
LOG2_RANGE = (-2.0, 3.0)
PROB_FLOOR = 1e-4
EDGES_LOG2 = np.log2(bins.BIN_EDGES)
A_GRID = np.geomspace(0.05, 3.0, 40)
B_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
META = "costmodel.json"


class CostModelError(ValueError):
    """Rows or a model folder the cost model cannot use; the message names the problem and the fix."""


# ---- rows -> features and labels ----------------------------------------------------------------

def labelled(rows, default_hardware=None, where="rows"):
    """(X, y, groups, true bins) of load_rows rows: features, clipped log2 speedups, and a group per
    distinct candidate code (rows of one kernel stay in one fold). A row's hardware is its own
    `hardware` field's profile, else `default_hardware`."""
    X, y, groups, true_bins = [], [], [], []
    for r in rows:
        for key in ("anchor_code", "candidate_code"):
            if not isinstance(r.get(key), str) or not r[key].strip():
                raise CostModelError(f"{where}: row {r.get('row_id')}: {key} must be the kernel's source code (a "
                                     f"non-empty string), got {type(r.get(key)).__name__}; fix or drop the row")
        try:
            hw = row_hardware(r, default_hardware)
        except ValueError as e:
            raise CostModelError(f"{where}: row {r.get('row_id')}: {e}") from None
        X.append(pair_features(r["pack"], r["anchor_code"], r["candidate_code"], hw))
        y.append(min(max(math.log2(float(r["aggregated_speedup"])), LOG2_RANGE[0]), LOG2_RANGE[1]))
        groups.append(zlib.crc32(r["candidate_code"].strip().encode()))
        true_bins.append(bins.speedup_to_bin(r["aggregated_speedup"]))
    return np.array(X, dtype=np.float64), np.array(y), np.array(groups), np.array(true_bins)


# ---- the trees ------------------------------------------------------------------------------------

def booster_params(n, seed):
    """LightGBM's settings for n rows: small leaves for small data, one thread, deterministic; rows are
    bagged from 10 on (below that a bag can come out empty), features always."""
    return dict(objective="regression", learning_rate=0.05, num_leaves=15, max_depth=6,
                min_data_in_leaf=max(1, min(10, n // 10)), min_sum_hessian_in_leaf=0.0, min_data_in_bin=1,
                max_bin=63, lambda_l2=1.0, bagging_fraction=0.8 if n >= 10 else 1.0, bagging_freq=int(n >= 10),
                feature_fraction=0.8,
                seed=seed, num_threads=1, deterministic=True, force_row_wise=True, verbose=-1)


def fit_ensemble(X, y, seed=0):
    import lightgbm as lgb
    out = []
    for k in range(ENSEMBLE):
        params = booster_params(len(y), seed * ENSEMBLE + k)
        data = lgb.Dataset(X, y, params={"min_data_in_bin": 1, "verbose": -1})
        out.append(lgb.train(params, data, num_boost_round=ROUNDS))
    return out


def predict_ensemble(boosters, X):
    """(mean, spread) of the boosters' log2-speedup predictions, one per row."""
    P = np.stack([b.predict(X) for b in boosters])
    return P.mean(axis=0), P.std(axis=0)


# ---- the distribution over bins, and its calibration --------------------------------------------------

def width(spread, a, b):
    return np.sqrt(a * a + (b * np.asarray(spread)) ** 2)


def bin_probs(mu, sigma):
    """[n, 8] probabilities of N(mu, sigma^2) over each bin's log2 interval, floored and renormalised."""
    from scipy.special import ndtr
    mu, sigma = np.atleast_1d(mu), np.maximum(np.atleast_1d(sigma), 1e-6)
    cdf = ndtr((EDGES_LOG2[None, :] - mu[:, None]) / sigma[:, None])
    p = np.diff(np.concatenate([np.zeros((len(mu), 1)), cdf, np.ones((len(mu), 1))], axis=1), axis=1)
    p = np.maximum(p, PROB_FLOOR)
    return p / p.sum(axis=1, keepdims=True)


def log_score(p, true_bins):
    return float(-np.mean(np.log(p[np.arange(len(true_bins)), np.asarray(true_bins) - 1])))


def fit_width(mu, spread, true_bins):
    """(a, b) of the width that gives the true bins the best log score, over the grid."""
    return min(((a, b) for a in A_GRID for b in B_GRID),
               key=lambda ab: log_score(bin_probs(mu, width(spread, *ab)), true_bins))


def forecast_scores(P, true_bins):
    """Accuracy, ECE, Brier, CRPS and NLL of [n, 8] forecasts (bins.py's scores, metrics.py's ECE)."""
    predicted = [bins.predicted_bin(p) for p in P]
    correct = [int(b) == int(y) for b, y in zip(predicted, true_bins)]
    return {"accuracy": float(np.mean(correct)),
            "ece": selective.ece([bins.confidence(p) for p in P], correct),
            **{name: float(np.mean([fn(p, int(y)) for p, y in zip(P, true_bins)]))
               for name, fn in (("brier", bins.brier), ("crps", bins.crps), ("nll", bins.nll))}}


def fold_of(groups, seed, folds=FOLDS):
    """(each row's fold, the number of folds): the distinct groups dealt round-robin in a seeded
    random order into `folds` folds (fewer when there are fewer groups)."""
    distinct = np.unique(groups)
    if len(distinct) < 2:
        raise CostModelError("every row has the same candidate code: held-out calibration needs at least 2 "
                             "distinct candidates; add rows of other kernels")
    k = min(folds, len(distinct))
    order = np.random.default_rng(seed).permutation(distinct)
    where = {g: i % k for i, g in enumerate(order)}
    return np.array([where[g] for g in groups]), k


# ---- the model --------------------------------------------------------------------------------------

class CostModel:
    """Boosters and the width's calibration (a, b); `report` the held-out calibration."""

    def __init__(self, boosters, a, b, report, info=None):
        self.boosters, self.a, self.b, self.report = boosters, float(a), float(b), report
        self.info = info or {}  # what the folder says of its rows (costmodel.json)

    @classmethod
    def train(cls, X, y, groups, true_bins, seed=0):
        """Out-of-fold forecasts -> calibration (reported held out), then the boosters on every row."""
        t0 = time.perf_counter()
        fold, k = fold_of(groups, seed)
        mu, spread = np.zeros(len(y)), np.zeros(len(y))
        for f in range(k):
            test = fold == f
            mu[test], spread[test] = predict_ensemble(fit_ensemble(X[~test], y[~test], seed), X[test])
        a, b = fit_width(mu, spread, true_bins)
        calibrated = np.zeros((len(y), bins.N_BINS))
        for f in range(k):  # each fold's width from the other folds' rows only
            test = fold == f
            af, bf = fit_width(mu[~test], spread[~test], true_bins[~test])
            calibrated[test] = bin_probs(mu[test], width(spread[test], af, bf))
        report = {
            "rows": int(len(y)), "distinct_candidates": int(len(np.unique(groups))), "folds": int(k),
            "a": float(a), "b": float(b), "rmse_log2": float(np.sqrt(np.mean((mu - y) ** 2))),
            "mean_spread": float(spread.mean()),
            "held_out": {"uniform": forecast_scores(np.tile(bins.UNIFORM, (len(y), 1)), true_bins),
                         "uncalibrated": forecast_scores(bin_probs(mu, np.maximum(spread, 1e-3)), true_bins),
                         "calibrated": forecast_scores(calibrated, true_bins)}}
        model = cls(fit_ensemble(X, y, seed), a, b, report)
        report["train_seconds"] = time.perf_counter() - t0
        return model

    def predict(self, X):
        """([n, 8] bin probabilities, mu, sigma) for feature rows X."""
        mu, spread = predict_ensemble(self.boosters, np.asarray(X, dtype=np.float64))
        sigma = width(spread, self.a, self.b)
        return bin_probs(mu, sigma), mu, sigma

    # ---- on disk: a folder, written whole or not at all ----

    def save(self, folder, **info):
        """Write the model into `folder` atomically: a temporary folder beside it is renamed into place,
        so an interrupted save leaves the old folder (or none), never half of one."""
        folder = Path(folder)
        check_out(folder)
        import lightgbm as lgb
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            for k, booster in enumerate(self.boosters):
                booster.save_model(str(tmp / f"booster{k}.txt"))
            meta = dict(feature_version=FEATURE_VERSION, feature_names=list(feature_names()), a=self.a, b=self.b,
                        boosters=len(self.boosters), lightgbm=lgb.__version__, report=self.report, **info)
            (tmp / META).write_text(json.dumps(meta, indent=1))
            if folder.exists():
                old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
                os.replace(folder, old)
                os.replace(tmp, folder)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder):
        """The model saved in `folder`; CostModelError (one line, with the fix) if it is none, or was
        made from another version of the features."""
        folder = Path(folder)
        retrain = f"retrain it: python train_costmodel.py --data ROWS.jsonl --out {folder}"
        try:
            meta = json.loads((folder / META).read_text())
        except FileNotFoundError:
            raise CostModelError(f"{folder} is not a cost model folder (no {META}); train one with "
                                 f"python train_costmodel.py --data ROWS.jsonl --out {folder}") from None
        except (OSError, ValueError) as e:
            raise CostModelError(f"{folder / META} cannot be read ({e}); {retrain}") from None
        if meta.get("feature_version") != FEATURE_VERSION or meta.get("feature_names") != list(feature_names()):
            raise CostModelError(f"{folder} holds a cost model of feature version {meta.get('feature_version')}, and "
                                 f"this code computes version {FEATURE_VERSION} (other features): {retrain}")
        import lightgbm as lgb
        try:
            boosters = [lgb.Booster(model_file=str(folder / f"booster{k}.txt")) for k in range(meta["boosters"])]
        except (lgb.basic.LightGBMError, KeyError, OSError) as e:
            raise CostModelError(f"{folder}: a booster cannot be read ({str(e).splitlines()[0][:200]}); {retrain}") from None
        return cls(boosters, meta["a"], meta["b"], meta.get("report", {}), info=meta)


def check_out(folder):
    """--out must be a new folder, an empty one, or a cost model folder (which is replaced)."""
    folder = Path(folder)
    if folder.exists() and not (folder.is_dir() and (not any(folder.iterdir()) or (folder / META).exists())):
        raise CostModelError(f"--out {folder} exists and is not a cost model folder; pass a new folder")


# ---- the forecaster ----------------------------------------------------------------------------------

class CostModelForecaster:
    """forecaster.Forecaster's interface (forecast_many, forecast_pairs, hardware, model) over a
    CostModel. Offline: `model` is a trained CostModel. Online (`online=True`, the search's): learn(rows)
    hands it the search's measured rows; before the next forecast it refits on them when new ones came,
    and until it has `min_labels` rows it defers every candidate to measurement (a Forecast with
    deferred=True, as the abstain variant's: the gates measure it). `prior`: rows measured before
    (earlier searches' training rows, each shown its own hardware), which every fit starts from, so
    that the first forecasts already have something to go on, as the paper's forecaster was
    trained on past measurements before it gated a search; `min_labels` counts them too."""

    def __init__(self, model=None, *, hardware=None, name="costmodel", online=False,
                 min_labels=ONLINE_MIN_LABELS, seed=0, prior=()):
        self.cost_model, self.hardware, self.model = model, hardware, name
        self.online, self.min_labels, self.seed = online, min_labels, seed
        self.prior = list(prior)
        # -1: fit before the first forecast when there is a prior to fit on
        self.rows, self.fitted_on, self.refits = [], -1 if self.prior else 0, 0

    def learn(self, rows):
        """The measured rows so far (training rows: anchor, candidate, speedup); all of them, each time."""
        self.rows = list(rows)

    def _refit(self):
        self.fitted_on = len(self.rows)
        if len(self.prior) + len(self.rows) < self.min_labels:
            return
        # the search's rows were measured here: every one gets this machine's profile; the prior's
        # keep their own
        here = self.prior + [{**r, "hardware": None} for r in self.rows]
        X, y, groups, true_bins = labelled(here, self.hardware, where="the cost model's rows")
        try:
            self.cost_model = CostModel.train(X, y, groups, true_bins, seed=self.seed)
            self.refits += 1
        except CostModelError:  # e.g. one distinct kernel so far: keep deferring
            self.cost_model = None

    def forecast_many(self, task, reference_code, candidate_codes, *, repeat=0):
        return self.forecast_pairs([(task, reference_code, c) for c in candidate_codes], repeat=repeat)

    def forecast_pairs(self, pairs, *, repeat=0, hardware=None):
        """One Forecast per (task, anchor_code, candidate_code); `hardware` one profile per pair (an
        eval row's own), else self.hardware. `repeat` changes nothing: the trees are deterministic."""
        t0 = time.perf_counter()
        if self.online and len(self.rows) != self.fitted_on:
            self._refit()
        if self.cost_model is None:
            why = (f"cost model: {len(self.prior) + len(self.rows)} measured kernel(s), it gates from "
                   f"{self.min_labels}; deferred to measurement")
            return [Forecast(deferred=True, reasoning=why, readout=None, model=self.model) for _ in pairs]
        hardware = hardware or [self.hardware] * len(pairs)
        X = [pair_features(t, a, c, hw) for (t, a, c), hw in zip(pairs, hardware)]
        P, mu, sigma = self.cost_model.predict(X)
        seconds = (time.perf_counter() - t0) / max(1, len(pairs))
        fit = (f" (fit on {len(self.rows)} measured kernels" + (f" and {len(self.prior)} earlier rows" if self.prior
               else "") + ")") if self.online else ""
        return [Forecast(probs=[float(x) for x in p], predicted_bin=bins.predicted_bin(p), raw_sum=1.0,
                         reasoning=f"cost model{fit}: log2 speedup {m:+.2f} +- {s:.2f} (~{2 ** m:.2f}x)",
                         readout=None, model=self.model, seconds=seconds)
                for p, m, s in zip(P, mu, sigma)]
