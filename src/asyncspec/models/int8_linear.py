"""int8 linears whose every output row is a function of its input row alone, on every x86 CPU.

Float matrix kernels pick their blocking from the call's shape, so a row's bits can depend on the
rows around it (models/fixed_shape.py); integer products cannot. Each step here is per row or per
element, and each is exact or exactly rounded:

- the weight is quantized once, per output channel: w ~ w_q[n] * w_scale[n], w_q in [-127, 127];
- an input row x is quantized by its own absmax: s = max|x| / 127 (max is order-free), then
  x_q = round(x / s) (one correctly rounded division and a round per element);
- x_q @ w_q^T accumulates int8 x int8 in int32: integer sums are exact in any order, blocking or
  batch (|sum| <= K * 127^2 < 2^31 for K < 133,000);
- y = acc * s * w_scale[n] + b, one correctly rounded multiply or add per element, each its own
  kernel so no fused multiply-add can round differently in a vector body and its scalar tail.

Never per-tensor dynamic quantization (`torch.ao.quantization.quantize_dynamic`): its scale is the
whole call's absmax, so a row's output would depend on the other rows of the call.

`torch._int_mm` takes the weight as [K, N]; at some shapes the transposed view of an [N, K] tensor
is faster (Whisper's 51,865-row output projection: 4.2 ms against 7.3 ms on a 2-core AMD EPYC),
at others the contiguous [K, N]; two more are weights packed once at load into a library's own
layout: oneDNN's (models/int8_packed.py) and FBGEMM's (models/int8_fbgemm.py, the fast one on an
AVX2-only CPU, where `_int_mm` has no fast path). The integers are the same in each, so each
linear keeps the layout measured fastest at load, remembered per machine (`remembered_layouts`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable

import torch

from asyncspec.models import int8_fbgemm, int8_packed
from asyncspec.models.cache_entries import entry_path, write_entry
from asyncspec.models.threads import openmp_settings

QMAX = 127  # symmetric: -128 is never produced, so no product needs its asymmetric range
# Without VNNI (AVX2), oneDNN and FBGEMM add u8 x s8 products in saturating int16 pairs, the signed
# input shifted by 128: 2 * 255 * 127 overflows, 2 * 255 * 63 = 32,130 does not. So on such a CPU the
# weights use 7 bits (measured by `weight_range`), as FBGEMM's reduce_range does.
REDUCED_WEIGHT_QMAX = 63
TINY = 1e-30  # an all-zero row has scale TINY and quantizes to zeros
TIMING_ROWS = 8  # the decoding width: the call every linear runs most
_LAYOUTS: dict[tuple[int, int], str] = {}  # (N, K) -> "kn", "nk", "packed" or "fbgemm", measured once per process
INT_MM_LAYOUTS = ("kn", "nk")
PREPACKED_LAYOUTS = ("packed", "fbgemm")  # a library's own layout, packed once at load
PACKED_PROBE_COLUMNS = 256  # a packed kernel's exactness probe: its blocking over N repeats
LAYOUTS_REVISION = 1  # bumped when a kernel's cost changes, so remembered layouts are timed anew


def quantize_rows(
    x: torch.Tensor, qmax: int = QMAX, codes: torch.dtype = torch.int8
) -> tuple[torch.Tensor, torch.Tensor]:
    """x float [..., K] -> (codes [..., K], integers in [-qmax, qmax], fp32 scale [..., 1]); a row
    (x's last dimension) depends on itself alone. `codes`: int8, or fp32 holding the same integers,
    for a kernel that reads them as fp32 anyway (FBGEMM's, a float product of codes): the
    conversion to int8 and back was 2 of the 13 operators of a one-row linear, 12 us of 92 (Zen 2,
    two threads)."""
    x = x if x.dtype == torch.float32 else x.float()  # each call is ~1 us of a 13 ms decoding step
    # in place on fresh tensors: a 1,500-frame encoder input allocated per step page-faulted its
    # way to 20 ms a call (one core); no clamp: |x / scale| <= qmax (1 + 2^-23) rounds to qmax
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_(min=TINY).div_(qmax)
    levels = torch.div(x, scale).round_()
    return (levels if codes == torch.float32 else levels.to(codes)), scale


_WEIGHT_RANGE: list[int] = []  # measured once per process


def weight_range() -> int:
    """The largest weight magnitude whose products torch._int_mm and FBGEMM (where torch has it) sum
    exactly on this CPU: 127, or REDUCED_WEIGHT_QMAX where full-range products saturate. FBGEMM
    counts: on an AVX2-only CPU it is the fast kernel, and it saturates at 8 bits where `_int_mm`
    may not. If neither range is exact with FBGEMM, `_int_mm`'s alone decides (then 127 again if
    neither is exact, and the self-test fails the target). Fixed per machine, never by timing:
    the range changes the weights' bits."""
    if not _WEIGHT_RANGE:
        kernel_sets = [(*INT_MM_LAYOUTS, "fbgemm"), INT_MM_LAYOUTS] if int8_fbgemm.available() else [INT_MM_LAYOUTS]
        chosen = QMAX
        for kernels in kernel_sets:
            if products_exact(512, 64, weight_max=QMAX, kernels=kernels):
                break
            if products_exact(512, 64, weight_max=REDUCED_WEIGHT_QMAX, kernels=kernels):
                chosen = REDUCED_WEIGHT_QMAX
                break
        _WEIGHT_RANGE.append(chosen)
    return _WEIGHT_RANGE[0]


class Int8Linear(torch.nn.Module):
    """A drop-in for `nn.Linear` (input of any float dtype, output fp32)."""

    weight_q: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        layout: str | None = None,
        kept: tuple[torch.Tensor, torch.Tensor] | None = None,  # `weight` already quantized
    ):
        super().__init__()
        quantized, scale = kept if kept is not None else quantize_rows(weight.detach(), weight_range())
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight_scale", scale.reshape(1, -1))  # [1, N]
        self.register_buffer("bias", None if bias is None else bias.detach().float().reshape(1, -1))
        self.layout, timed = (layout, None) if layout else measured_layout(quantized)
        # "kn": a contiguous [K, N] tensor; "nk" and the prepacked ones: the [N, K] tensor (passed
        # to torch._int_mm as its transposed view; prepacked, kept for copies)
        self.register_buffer("weight_q", quantized.t().contiguous() if self.layout == "kn" else quantized)
        self.prepacked = None
        if self.layout in PREPACKED_LAYOUTS:  # the packing timed on this very weight, else a new one
            self.prepacked = timed or prepack(self.layout, quantized)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    def integer_products(self, x_q: torch.Tensor) -> torch.Tensor:
        """int8 [M, K] -> the exact sums [M, N]: int32, or from a prepacked kernel fp32 (the same
        integers, each converted once, as `.float()` converts the int32)."""
        if self.prepacked is not None:
            return self.prepacked(x_q)
        weight = self.weight_q if self.layout == "kn" else self.weight_q.t()
        return torch._int_mm(x_q, weight)

    @property
    def codes_dtype(self) -> torch.dtype:
        """The input codes its kernel reads without a conversion: FBGEMM's takes fp32 integers."""
        return torch.float32 if isinstance(self.prepacked, int8_fbgemm.FbgemmProducts) else torch.int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        x_q, scale = quantize_rows(x.reshape(-1, self.in_features), codes=self.codes_dtype)
        return self.from_quantized(x_q, scale).reshape(*leading, self.out_features)

    def from_quantized(self, x_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The output [M, N] of rows already quantized by `quantize_rows` (codes [M, K] in
        `codes_dtype`, or int8 for any kernel; scale [M, 1])."""
        y = self.integer_products(x_q)
        y = (y if y.dtype == torch.float32 else y.float()).mul_(scale).mul_(self.weight_scale)  # fresh: in place
        return y if self.bias is None else y.add_(self.bias)

    @classmethod
    def side_by_side(cls, linears: list[Int8Linear]) -> Int8Linear:
        """One Int8Linear whose output is the linears' outputs side by side (all reading inputs of
        one width). Each output column is the same integer sum, times the same two scales, plus the
        same bias, as in its own linear: the same bits (a linear without bias gets zeros, and
        y + 0.0 is y: y is never -0.0, as integer sum 0 times positive scales is +0.0). One
        quantized kernel call where there were several: a self-attention's q, k and v at one row
        cost 117 us as three FBGEMM calls against 46 us as one (Zen 2, two threads)."""
        quantized = torch.cat([linear.quantized_weight() for linear in linears])
        scale = torch.cat([linear.weight_scale.reshape(-1, 1) for linear in linears])
        biases = [
            torch.zeros(linear.out_features) if linear.bias is None else linear.bias.reshape(-1) for linear in linears
        ]
        bias = None if all(linear.bias is None for linear in linears) else torch.cat(biases)
        return cls(quantized, bias, kept=(quantized, scale))  # `weight` gives the shape alone

    def quantized_weight(self) -> torch.Tensor:
        """The int8 weight [N, K], whatever the layout it is kept in."""
        return self.weight_q.t() if self.layout == "kn" else self.weight_q

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, layout={self.layout}"


def shared_input(linears: list[torch.nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """Each linear applied to the same input x [M, K]: where all are int8, x is quantized once for
    all of them (the same bits as each quantizing it: `quantize_rows` is a function of the row).
    A Whisper window's twelve cross-attention projections of its 1,500 encoder frames quantized
    the frames twelve times, 2.6 ms each on one core."""
    int8 = [linear for linear in linears if isinstance(linear, Int8Linear)]
    if len(int8) < len(linears):
        return [linear(x) for linear in linears]
    codes = {linear.codes_dtype for linear in int8}
    x_q, scale = quantize_rows(x, codes=codes.pop() if len(codes) == 1 else torch.int8)
    return [linear.from_quantized(x_q, scale) for linear in int8]


class SideBySide:
    """Linears reading one input (a self-attention's q, k and v), as a list of their outputs: where
    all are int8, one `Int8Linear.side_by_side` call split into views; else `shared_input`."""

    def __init__(self, linears: list[torch.nn.Module]):
        self.linears = linears
        self.widths = [linear.out_features for linear in linears]
        int8 = [linear for linear in linears if isinstance(linear, Int8Linear)]
        self.stacked = Int8Linear.side_by_side(int8) if len(int8) == len(linears) else None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.stacked is None:
            return shared_input(self.linears, x)
        return list(self.stacked(x).split(self.widths, dim=-1))


Prepacked = int8_packed.PackedProducts | int8_fbgemm.FbgemmProducts


def prepack(layout: str, quantized: torch.Tensor) -> Prepacked:
    """The weight [N, K] packed for the "packed" (oneDNN) or "fbgemm" kernel."""
    if layout == "fbgemm":
        return int8_fbgemm.FbgemmProducts(quantized)
    return int8_packed.PackedProducts(quantized, TIMING_ROWS, weight_range())


def measured_layout(quantized: torch.Tensor) -> tuple[str, Prepacked | None]:
    """The fastest weight layout at the decoding width, for this [N, K] shape: torch._int_mm on
    [K, N] or on [N, K] transposed, or a prepacked kernel (oneDNN's, FBGEMM's) where it is exact
    here. With it, when this call timed a prepacked kernel on `quantized` and it won, that
    packing, to keep (packing a 151,936 x 1,536 weight takes over a second)."""
    n, k = quantized.shape
    packings: dict[str, Prepacked] = {}
    if (n, k) not in _LAYOUTS:
        remembered = remembered_layouts().get(f"{n}x{k}")
        if remembered in INT_MM_LAYOUTS or (remembered in PREPACKED_LAYOUTS and prepacked_exact(remembered, k)):
            _LAYOUTS[(n, k)] = remembered
        else:
            _LAYOUTS[(n, k)] = _fastest_layout(quantized, packings)
            remember_layout(f"{n}x{k}", _LAYOUTS[(n, k)])
    layout = _LAYOUTS[(n, k)]
    return layout, packings.get(layout)


def _fastest_layout(quantized: torch.Tensor, packings: dict[str, Prepacked]) -> str:
    """Time every layout exact here on `quantized` [N, K]; the prepacked ones' packings go into `packings`."""
    probe = torch.ones(TIMING_ROWS, quantized.shape[1], dtype=torch.int8)
    kn = quantized.t().contiguous()
    candidates: dict[str, Callable[[], torch.Tensor]] = {
        "kn": lambda: torch._int_mm(probe, kn),
        "nk": lambda: torch._int_mm(probe, quantized.t()),
    }
    for layout in PREPACKED_LAYOUTS:
        if prepacked_exact(layout, quantized.shape[1]):
            packings[layout] = prepack(layout, quantized)
            candidates[layout] = functools.partial(packings[layout], probe)
    timings = {name: seconds_of_three(run) for name, run in candidates.items()}
    return min(timings, key=timings.__getitem__)


def remembered_layouts() -> dict[str, str]:
    """Each weight shape ("NxK") -> its layout measured fastest on this machine, by earlier
    processes too. Timing the candidates was half of an int8 Whisper base's load on an AVX2-only
    EPYC (torch._int_mm's slow path: 0.9 of 2.1 s). Every layout sums the same integers, so a
    stale, lost or damaged entry costs time, never a bit; a remembered prepacked layout is used
    only where its probe passes."""
    try:
        entry = json.loads(_layouts_file().read_text())
        return {shape: layout for shape, layout in entry.items() if isinstance(layout, str)}
    except (OSError, ValueError, AttributeError):
        return {}


def remember_layout(shape: str, layout: str) -> None:
    """Add one shape's layout to this machine's entry (a process writing at once may drop it: then
    it is timed again; so is every shape where the cache cannot be written)."""
    try:
        write_entry(_layouts_file(), remembered_layouts() | {shape: layout})
    except OSError:
        pass


def _layouts_file():
    from asyncspec.models.selftest import machine_identity  # it imports this module

    key = {"rows": TIMING_ROWS, "openmp": openmp_settings(), "range": weight_range(), "revision": LAYOUTS_REVISION}
    return entry_path("int8-layouts", machine_identity() | key)


def seconds_of_three(run: Callable[[], object]) -> float:
    """Seconds of three calls `run()` after one untimed (the kernel is chosen on the first call)."""
    run()
    start = time.perf_counter()
    for _ in range(3):
        run()
    return time.perf_counter() - start


_PREPACKED_EXACT: dict[tuple[str, int, int], bool] = {}  # (layout, K, weight range) -> exact here


def prepacked_exact(layout: str, k: int) -> bool:
    """Is the "packed" (oneDNN, in its chunks: int8_packed.py) or "fbgemm" kernel in this torch,
    and exact at depth `k` on this CPU with the weight range in use?"""
    key = (layout, k, weight_range())
    if key not in _PREPACKED_EXACT:
        here = int8_fbgemm.available() if layout == "fbgemm" else int8_packed.available()
        _PREPACKED_EXACT[key] = here and products_exact(k, PACKED_PROBE_COLUMNS, kernels=(layout,))
    return _PREPACKED_EXACT[key]


def quantize_linears(module: torch.nn.Module, quantized: dict | None = None, prefix: str = "") -> int:
    """Replace every nn.Linear inside `module` by an Int8Linear, in place; returns how many.
    `quantized`: weights already quantized, by the linear's name in `module` (int8_weights.py)."""
    replaced = 0
    for name, child in list(module.named_children()):
        path = f"{prefix}{name}"
        if isinstance(child, torch.nn.Linear):
            kept = None if quantized is None else quantized[path]
            setattr(module, name, Int8Linear(child.weight, child.bias, kept=kept))
            replaced += 1
        else:
            replaced += quantize_linears(child, quantized, f"{path}.")
    return replaced


def linear_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weight of every nn.Linear inside `module`, by its name there (as `quantize_linears` names it)."""
    return {name: child.weight for name, child in module.named_modules() if isinstance(child, torch.nn.Linear)}


def products_exact(
    k: int,
    n: int,
    rows: int = TIMING_ROWS,
    seed: int = 0,
    matmul=None,
    weight_max: int | None = None,
    kernels: tuple[str, ...] | None = None,
) -> bool:
    """Does torch._int_mm (or `matmul`) compute exact int32 sums here, at the extremes (inputs
    +-127, weights +-weight_max, by default the range in use: where a kernel that pairs products
    into int16 would saturate)? Checked against float64, exact below 2^53, in both weight layouts,
    and in each prepacked kernel wherever a linear may use it (its fp32 sums against the exact sums
    rounded once to fp32). `kernels` restricts the check to some of "kn", "nk", "packed" and "fbgemm"."""
    matmul = matmul or torch._int_mm
    kernels = kernels or (*INT_MM_LAYOUTS, *(layout for layout in PREPACKED_LAYOUTS if prepacked_exact(layout, k)))
    w_max = weight_max if weight_max is not None else weight_range()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-QMAX, QMAX + 1, (rows, k), generator=generator, dtype=torch.int8)
    w = torch.randint(-w_max, w_max + 1, (n, k), generator=generator, dtype=torch.int8)
    x[0] = QMAX
    x[1] = -QMAX
    w[0] = w_max
    w[1] = -w_max
    reference = x.double() @ w.double().t()
    runs = {
        "kn": lambda: matmul(x, w.t().contiguous()),
        "nk": lambda: matmul(x, w.t()),
        "packed": lambda: int8_packed.PackedProducts(w, rows, w_max)(x),
        "fbgemm": lambda: int8_fbgemm.FbgemmProducts(w)(x),
    }
    return all(torch.equal(runs[kernel]().double(), _as_output(reference, kernel)) for kernel in kernels)


def _as_output(exact: torch.Tensor, kernel: str) -> torch.Tensor:
    """The exact float64 sums as `kernel` returns them: int32 (exact), or prepacked fp32 (rounded once)."""
    return exact.float().double() if kernel in PREPACKED_LAYOUTS else exact
