"""Independent float64 NumPy re-computations of jaxnorm's normalizations (test oracles).

Written from the formulas in ../shared/notes/algorithms.md, not from jaxnorm's code: plain two-pass
statistics on float64 copies, explicit loops where that is clearer.
"""

import contextlib
import math

import jax
import numpy as np

L1 = math.sqrt(math.pi / 2)


def normal(shape, seed=0, loc=0.0, scale=1.0, dtype=np.float64):
    """Gaussian test data from NumPy's generator (float64 unless ``dtype`` says otherwise)."""
    return np.random.default_rng(seed).normal(loc, scale, shape).astype(dtype)


def linf_c(n):
    return (1 + math.sqrt(math.pi * math.log(4))) / (2 * math.sqrt(2 * math.log(max(n, 2))))


def expected_topk_abs_normal(n, k=1):
    """E[mean of top-k of n |N(0,1)|] by integrating order-statistic densities with scipy (float64)."""
    from scipy import integrate, special, stats

    total = 0.0
    for i in range(n - k + 1, n + 1):  # i-th order statistic of n half-normals
        log_coef = special.gammaln(n + 1) - special.gammaln(i) - special.gammaln(n - i + 1)

        def density(x, i=i, log_coef=log_coef):
            cdf = special.erf(x / math.sqrt(2))
            sf = special.erfc(x / math.sqrt(2))
            pdf = 2 * stats.norm.pdf(x)
            if cdf <= 0 or sf <= 0:
                return 0.0
            return x * math.exp(log_coef + (i - 1) * math.log(cdf) + (n - i) * math.log(sf)) * pdf

        total += integrate.quad(density, 0, 40, limit=400, epsabs=1e-13, epsrel=1e-12)[0]
    return total / k


def expected_topk_abs_normal_binomial(n, k=1):
    """The same expectation as :func:`expected_topk_abs_normal` another way, for large ``n``:
    ``int_0^inf sum_{m<=k} P(Binomial(n, q(x)) >= m) dx / k`` with scipy's binomial survival function,
    ``q(x) = erfc(x / sqrt 2)``, quad with breakpoints around the mode ``sqrt(2 ln n)`` (float64)."""
    from scipy import integrate, special, stats

    def integrand(x):
        q = special.erfc(x / math.sqrt(2))
        return sum(stats.binom.sf(m - 1, n, q) for m in range(1, k + 1))

    mode = math.sqrt(2 * math.log(n))
    points = np.linspace(max(mode - 3, 0.01), mode + 2, 30)
    upper = math.sqrt(2 * (math.log(n) + 30))
    return integrate.quad(integrand, 0, upper, points=points, limit=500, epsabs=1e-13, epsrel=1e-12)[0] / k


def dispersion_sq(deviations, p, topk=None, calibration="paper"):
    """sigma_hat^2 of a 1-D array of deviations from the mean."""
    n = deviations.size
    a = np.abs(deviations)
    if p == 2:
        return np.mean(a**2)
    if p == 1:
        return (L1 * np.mean(a)) ** 2
    top = np.mean(np.sort(a)[-topk:]) if topk else np.max(a)
    c = 1 / expected_topk_abs_normal(n, topk or 1) if calibration == "exact" else linf_c(n)
    return (c * top) ** 2


def batch_moments(x, p=2, axis=-1, topk=None, mask=None, calibration="paper"):
    """Per-feature (mean, sigma_hat^2), features on ``axis`` (int), masked elements excluded."""
    x = np.asarray(x, np.float64)
    mask = np.ones(x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), x.shape)
    columns = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    keep = np.moveaxis(mask, axis, -1).reshape(-1, x.shape[axis])
    means, variances = [], []
    for j in range(columns.shape[-1]):
        col = columns[keep[:, j], j]
        mu = col.mean()
        means.append(mu)
        variances.append(dispersion_sq(col - mu, p, topk, calibration))
    return np.array(means), np.array(variances)


def batch_norm(x, p=2, topk=None, epsilon=1e-5, calibration="paper"):
    """Channels-last batch norm over every axis but the last."""
    mean, var = batch_moments(x, p, -1, topk, calibration=calibration)
    return (np.asarray(x, np.float64) - mean) / np.sqrt(var + epsilon)


def per_example_norm(x, groups_axes_fn, p, epsilon):
    """Normalize each example's groups: ``groups_axes_fn(x_example)`` -> list of index arrays."""
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    for b in range(x.shape[0]):
        for idx in groups_axes_fn(x[b]):
            values = x[b][idx]
            dev = values - values.mean()
            out[b][idx] = dev / np.sqrt(dispersion_sq(dev.ravel(), p) + epsilon)
    return out


def layer_norm(x, p=2, epsilon=1e-5):
    return per_example_norm(x, lambda e: [np.ones(e.shape, bool)], p, epsilon)


def group_norm(x, num_groups, p=2, epsilon=1e-5):
    def groups(e):
        c = e.shape[-1]
        size = c // num_groups
        masks = []
        for g in range(num_groups):
            m = np.zeros(e.shape, bool)
            m[..., g * size : (g + 1) * size] = True
            masks.append(m)
        return masks

    return per_example_norm(x, groups, p, epsilon)


def instance_norm(x, p=2, epsilon=1e-5):
    def channels(e):
        masks = []
        for c in range(e.shape[-1]):
            m = np.zeros(e.shape, bool)
            m[..., c] = True
            masks.append(m)
        return masks

    return per_example_norm(x, channels, p, epsilon)


def unit_norms(w):
    w = np.asarray(w, np.float64)
    return np.sqrt((w.reshape(-1, w.shape[-1]) ** 2).sum(0))


def weight_norm(v, g):
    return np.asarray(g, np.float64) * np.asarray(v, np.float64) / unit_norms(v)


def fans(shape):
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def weight_standardization(w, gain=None, epsilon=1e-5):
    w = np.asarray(w, np.float64)
    flat = w.reshape(-1, w.shape[-1])
    fan_in = flat.shape[0]
    mean, var = flat.mean(0), flat.var(0)
    out = (w - mean) / np.sqrt(np.maximum(var * fan_in, epsilon))
    return out if gain is None else out * gain


@contextlib.contextmanager
def float64():
    """``jax_enable_x64`` on inside the block (for hypothesis tests, where fixtures are per test)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)
