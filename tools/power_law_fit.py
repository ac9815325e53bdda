"""L(C) = a * C^(-alpha) + L_inf fitted by least squares (scipy's curve_fit), with the standard
errors from its covariance. Pure numbers in, numbers out: tools/compare_runs.py selects and draws."""
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass
class PowerLawFit:
    a: float
    alpha: float
    l_inf: float
    a_err: float
    alpha_err: float
    l_inf_err: float
    points: int
    c_min: float
    c_max: float

    def __call__(self, c: np.ndarray) -> np.ndarray:
        return self.a * np.power(c, -self.alpha) + self.l_inf

    def describe(self) -> str:
        return (f"L(C) = a * C^(-alpha) + L_inf: a = {self.a:.4g} +- {self.a_err:.2g}, "
                f"alpha = {self.alpha:.4f} +- {self.alpha_err:.4f}, L_inf = {self.l_inf:.4f} +- {self.l_inf_err:.4f} "
                f"({self.points} points, C from {self.c_min:.4g} to {self.c_max:.4g} gigaflos)")


def fit_power_law(c: npt.ArrayLike, loss: npt.ArrayLike) -> PowerLawFit:
    """Three parameters need at least four points for an uncertainty (ValueError otherwise)."""
    from scipy.optimize import curve_fit
    c, loss = np.asarray(c, dtype=float), np.asarray(loss, dtype=float)
    if len(c) < 4:
        raise ValueError(f"{len(c)} points: a 3-parameter fit with an uncertainty needs at least 4")
    if np.any(c <= 0):
        raise ValueError("compute must be positive for a power law")
    # C around 1 decorrelates a from alpha: fit a' (C / c0)^-alpha, then a = a' c0^alpha
    c0 = float(np.exp(np.mean(np.log(c))))
    x = c / c0
    # start: L_inf a little under the lowest loss, then a line through log(L - L_inf) vs log C
    l_inf0 = max(0.0, loss.min() - 0.1 * (loss.max() - loss.min()) - 1e-3)
    slope, intercept = np.polyfit(np.log(x), np.log(np.maximum(loss - l_inf0, 1e-6)), 1)
    start = (np.exp(intercept), max(-slope, 1e-3), l_inf0)

    def model(x: np.ndarray, a: float, alpha: float, l_inf: float) -> np.ndarray:
        return a * np.power(x, -alpha) + l_inf

    # a loss that falls with compute towards a non-negative floor: a, alpha, L_inf >= 0
    params, cov = curve_fit(model, x, loss, p0=start, bounds=(0, np.inf), maxfev=20000)
    a_scaled, alpha, l_inf = params
    # a = a' c0^alpha: its error by the Jacobian of (a', alpha) -> a
    scale = c0 ** alpha
    jac = np.array([[scale, a_scaled * scale * np.log(c0), 0.0], [0, 1, 0], [0, 0, 1]])
    cov = jac @ cov @ jac.T
    a_err, alpha_err, l_inf_err = np.sqrt(np.diag(cov))
    return PowerLawFit(a_scaled * scale, alpha, l_inf, a_err, alpha_err, l_inf_err, len(c), c.min(), c.max())
