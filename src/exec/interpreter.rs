//! The chunk interpreter: runs a fused loop's [`FusedPlan`] over one range
//! of elements, [`CHUNK`](crate::exec::runtime::CHUNK) elements at a time.
//!
//! Each body instruction is evaluated over a chunk into a chunk-sized
//! scratch register ([`Reg`], one set per thread), each input chunk is read
//! where it lies, and only loop outputs are written to their buffers: a
//! direct output by its instruction, the others copied out of their
//! registers once the chunk's body has run. Dispatch happens once per
//! instruction per chunk; the inner loops ([`exec`], [`exec_in_place`],
//! [`exec_product`]) are typed (`f32`, `f64`, `i32`, `pred`) and
//! monomorphized per op, so they auto-vectorize, and `cpu_dispatch!`
//! compiles each for AVX-512 and AVX2 as well, picked once per process.
//!
//! The plan (registers, direct and in-place outputs, folded multiplies) is
//! made by [`crate::exec::loop_plan`]; this module only follows it. Rust
//! never contracts `a * b + c` into an FMA, so every loop rounds exactly
//! like the shared kernels.

use smallvec::SmallVec;

use crate::exec::error::LoopError;
use crate::exec::loop_plan::{BodyInstr, FusedPlan, Src};
use crate::ir::{BinaryOp, CompareDir, DType, FloatElement, Op, UnaryOp};
use crate::kernels::elementwise::{float_max, float_min, int_pow};

fn reg_mut(r: &mut Reg, n: usize) -> ChunkMut<'_> {
    match r {
        Reg::Pred(v) => ChunkMut::Pred(&mut v[..n]),
        Reg::I32(v) => ChunkMut::I32(&mut v[..n]),
        Reg::F32(v) => ChunkMut::F32(&mut v[..n]),
        Reg::F64(v) => ChunkMut::F64(&mut v[..n]),
    }
}

/// A typed mutable chunk view of `n` elements at element offset `lo`.
///
/// # Safety
/// `ptr` must address at least `lo + n` elements of the dtype that nothing
/// else reads or writes while the view lives.
unsafe fn chunk_mut_at<'a>(dtype: DType, ptr: usize, lo: usize, n: usize) -> ChunkMut<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => ChunkMut::Pred(std::slice::from_raw_parts_mut(
                (ptr as *mut bool).add(lo),
                n,
            )),
            DType::I32 => {
                ChunkMut::I32(std::slice::from_raw_parts_mut((ptr as *mut i32).add(lo), n))
            }
            DType::F32 => {
                ChunkMut::F32(std::slice::from_raw_parts_mut((ptr as *mut f32).add(lo), n))
            }
            DType::F64 => {
                ChunkMut::F64(std::slice::from_raw_parts_mut((ptr as *mut f64).add(lo), n))
            }
        }
    }
}

/// Scratch registers of one thread.
pub(super) enum Reg {
    Pred(Vec<bool>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Default for Reg {
    fn default() -> Self {
        Reg::Pred(Vec::new())
    }
}

/// A chunk of an operand: a slice or a scalar broadcast over the chunk.
#[derive(Clone, Copy)]
pub(super) enum S<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
}

#[derive(Clone, Copy)]
pub(super) enum Chunk<'a> {
    Pred(S<'a, bool>),
    I32(S<'a, i32>),
    F32(S<'a, f32>),
    F64(S<'a, f64>),
}

pub(super) enum ChunkMut<'a> {
    Pred(&'a mut [bool]),
    I32(&'a mut [i32]),
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
}

pub(super) struct LoopCtx<'p> {
    pub(super) plan: &'p FusedPlan,
    pub(super) exec: ExecFn,
    pub(super) exec_in_place: ExecInPlaceFn,
    pub(super) exec_product: ExecProductFn,
    /// Per output: whether it took its donor input over in this run.
    pub(super) donated: SmallVec<[bool; 4]>,
    /// Distinct `(address, element size)` of the loop's inputs and outputs.
    pub(super) streams: SmallVec<[(usize, usize); 8]>,
    pub(super) inputs: &'p [usize],
    pub(super) prelude: &'p [usize],
    pub(super) outputs: &'p [usize],
    pub(super) chunk: usize,
}

// SAFETY (for the raw addresses shared by the tasks): every task reads the
// inputs and writes the outputs only inside its own element range, and the
// buffers outlive the parallel loop (they are held by `run_fused`).
unsafe impl Sync for LoopCtx<'_> {}

/// A typed chunk view of `n` elements at element offset `lo` of address `ptr`.
///
/// # Safety
/// `ptr` must address at least `lo + n` initialised elements of the dtype.
unsafe fn chunk_at<'a>(dtype: DType, ptr: usize, lo: usize, n: usize) -> Chunk<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => Chunk::Pred(S::Slice(std::slice::from_raw_parts(
                (ptr as *const bool).add(lo),
                n,
            ))),
            DType::I32 => Chunk::I32(S::Slice(std::slice::from_raw_parts(
                (ptr as *const i32).add(lo),
                n,
            ))),
            DType::F32 => Chunk::F32(S::Slice(std::slice::from_raw_parts(
                (ptr as *const f32).add(lo),
                n,
            ))),
            DType::F64 => Chunk::F64(S::Slice(std::slice::from_raw_parts(
                (ptr as *const f64).add(lo),
                n,
            ))),
        }
    }
}

/// The element at `ptr` as a scalar chunk.
///
/// # Safety
/// `ptr` must address one initialised element of the dtype.
unsafe fn scalar_at<'a>(dtype: DType, ptr: usize) -> Chunk<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => Chunk::Pred(S::Scalar(*(ptr as *const bool))),
            DType::I32 => Chunk::I32(S::Scalar(*(ptr as *const i32))),
            DType::F32 => Chunk::F32(S::Scalar(*(ptr as *const f32))),
            DType::F64 => Chunk::F64(S::Scalar(*(ptr as *const f64))),
        }
    }
}

impl LoopCtx<'_> {
    pub(super) fn registers(&self) -> Vec<Reg> {
        let n = self.chunk.min(self.plan.len);
        self.plan
            .regs
            .iter()
            .map(|d| match d {
                DType::Pred => Reg::Pred(vec![false; n]),
                DType::I32 => Reg::I32(vec![0; n]),
                DType::F32 => Reg::F32(vec![0.0; n]),
                DType::F64 => Reg::F64(vec![0.0; n]),
            })
            .collect()
    }

    pub(super) fn run_range(
        &self,
        lo: usize,
        hi: usize,
        regs: &mut [Reg],
    ) -> Result<(), LoopError> {
        let mut at = lo;
        while at < hi {
            let n = self.chunk.min(hi - at);
            self.run_chunk(at, n, regs)?;
            at += n;
        }
        Ok(())
    }

    /// Asks for part `part` of `parts` of the next chunk `[from, from + n)`
    /// of every stream. Spread over the body's instructions, the loads of
    /// all inputs overlap the arithmetic instead of stalling in one burst.
    #[inline]
    fn prefetch(&self, from: usize, n: usize, part: usize, parts: usize) {
        #[cfg(target_arch = "x86_64")]
        for &(base, size) in &self.streams {
            let start = (base + from * size) & !63;
            let lines = (base + (from + n) * size)
                .saturating_sub(start)
                .div_ceil(64);
            let (a, b) = (lines * part / parts, lines * (part + 1) / parts);
            for line in a..b {
                // SAFETY: a prefetch never faults and has no visible effect.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        (start + line * 64) as *const i8,
                    );
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (from, n, part, parts);
    }

    fn chunk_args<'r>(
        &self,
        instr: &BodyInstr,
        lo: usize,
        n: usize,
        regs: &'r [Reg],
    ) -> SmallVec<[Chunk<'r>; 4]> {
        instr
            .args
            .iter()
            .zip(&instr.arg_types)
            .map(|(&src, &dtype)| self.chunk_src(src, dtype, lo, n, regs))
            .collect()
    }

    fn chunk_src<'r>(
        &self,
        src: Src,
        dtype: DType,
        lo: usize,
        n: usize,
        regs: &'r [Reg],
    ) -> Chunk<'r> {
        // SAFETY: inputs, outputs and prelude values of the loop shape hold
        // `plan.len` elements; scalars hold one; the chunk lies inside the
        // loop shape. `Dest` reaches here only when its output did not take
        // the input over, so it reads the input itself.
        unsafe {
            match src {
                Src::Input(i) | Src::Dest(i) => chunk_at(dtype, self.inputs[i as usize], lo, n),
                Src::Prelude(l) => chunk_at(dtype, self.prelude[l as usize], lo, n),
                Src::InputScalar(i) => scalar_at(dtype, self.inputs[i as usize]),
                Src::PreludeScalar(l) => scalar_at(dtype, self.prelude[l as usize]),
                Src::Reg(r) => reg_chunk(&regs[r as usize], n),
                Src::Output(o) => chunk_at(dtype, self.outputs[o as usize], lo, n),
            }
        }
    }

    fn run_chunk(&self, lo: usize, n: usize, regs: &mut [Reg]) -> Result<(), LoopError> {
        let plan = self.plan;
        let next = (lo + n).min(plan.len);
        let ahead = n.min(plan.len - next);
        let parts = plan.body.len().max(1);
        for (k, instr) in plan.body.iter().enumerate() {
            self.prefetch(next, ahead, k, parts);
            if let Some(first) = instr.product_first {
                let dtype = plan.regs[instr.reg as usize];
                let mut dst = match instr.direct {
                    Some(_) => None,
                    None => Some(std::mem::take(&mut regs[instr.reg as usize])),
                };
                let [a, b, c] = instr.args[..] else {
                    return Err(LoopError::ProductArity);
                };
                let (a, b) = (
                    self.chunk_src(a, dtype, lo, n, regs),
                    self.chunk_src(b, dtype, lo, n, regs),
                );
                let in_place = matches!(c, Src::Dest(_))
                    && instr.direct.is_some_and(|o| self.donated[o as usize]);
                let c = (!in_place).then(|| self.chunk_src(c, dtype, lo, n, regs));
                let sub = matches!(instr.op, Op::Binary(BinaryOp::Sub));
                let result = match (instr.direct, dst.as_mut()) {
                    (Some(o), _) => {
                        // SAFETY: as for any direct output (below); with
                        // `in_place` the destination holds the donor, read
                        // only here.
                        let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                        (self.exec_product)(a, b, c, first, sub, out)
                    }
                    (None, Some(d)) => (self.exec_product)(a, b, c, first, sub, reg_mut(d, n)),
                    (None, None) => Err(LoopError::NoDestination),
                };
                if let Some(d) = dst {
                    regs[instr.reg as usize] = d;
                }
                result?;
                continue;
            }
            if let Some(o) = instr.direct {
                let dtype = plan.regs[instr.reg as usize];
                if let Some(dest_first) = instr.reads_dest()
                    && self.donated[o as usize]
                {
                    let other = instr.args[usize::from(dest_first)];
                    let other = self.chunk_src(other, instr.arg_types[0], lo, n, regs);
                    // SAFETY: as below; the destination holds the donor
                    // input, which only this instruction reads.
                    let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                    (self.exec_in_place)(&instr.op, other, dest_first, out)?;
                    continue;
                }
                let args = self.chunk_args(instr, lo, n, regs);
                // SAFETY: the output holds `plan.len` elements of `dtype`,
                // this task alone writes `[lo, lo + n)`, and no operand of
                // this or a later instruction reads that memory as an input
                // (`mark_direct_outputs`).
                let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                (self.exec)(&instr.op, &args, out)?;
                continue;
            }
            let mut dst = std::mem::take(&mut regs[instr.reg as usize]);
            {
                let args = self.chunk_args(instr, lo, n, regs);
                let out = match &mut dst {
                    Reg::Pred(v) => ChunkMut::Pred(&mut v[..n]),
                    Reg::I32(v) => ChunkMut::I32(&mut v[..n]),
                    Reg::F32(v) => ChunkMut::F32(&mut v[..n]),
                    Reg::F64(v) => ChunkMut::F64(&mut v[..n]),
                };
                (self.exec)(&instr.op, &args, out)?;
            }
            regs[instr.reg as usize] = dst;
        }
        for (o, out) in plan.outputs.iter().enumerate() {
            if out.prelude.is_some() || out.direct {
                continue;
            }
            let ptr = self.outputs[o];
            // SAFETY: the destination holds `plan.len` elements of the
            // register's dtype; this task alone writes `[lo, lo + n)`, and
            // every read of that range in this chunk happened above.
            unsafe {
                match &regs[out.reg as usize] {
                    Reg::Pred(v) => copy_out(v, ptr as *mut bool, lo, n),
                    Reg::I32(v) => copy_out(v, ptr as *mut i32, lo, n),
                    Reg::F32(v) => copy_out(v, ptr as *mut f32, lo, n),
                    Reg::F64(v) => copy_out(v, ptr as *mut f64, lo, n),
                }
            }
        }
        Ok(())
    }
}

/// # Safety
/// `dst` must address at least `lo + n` elements this thread may write.
unsafe fn copy_out<T: Copy>(src: &[T], dst: *mut T, lo: usize, n: usize) {
    // SAFETY: the caller's contract; `src` is scratch, never the destination.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(lo), n) };
}

fn reg_chunk(r: &Reg, n: usize) -> Chunk<'_> {
    match r {
        Reg::Pred(v) => Chunk::Pred(S::Slice(&v[..n])),
        Reg::I32(v) => Chunk::I32(S::Slice(&v[..n])),
        Reg::F32(v) => Chunk::F32(S::Slice(&v[..n])),
        Reg::F64(v) => Chunk::F64(S::Slice(&v[..n])),
    }
}

#[inline(always)]
fn map1<A: Copy, R: Copy>(a: S<'_, A>, out: &mut [R], f: impl Fn(A) -> R) {
    match a {
        S::Slice(x) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x);
            }
        }
        S::Scalar(x) => out.fill(f(x)),
    }
}

#[inline(always)]
fn map2<A: Copy, B: Copy, R: Copy>(a: S<'_, A>, b: S<'_, B>, out: &mut [R], f: impl Fn(A, B) -> R) {
    match (a, b) {
        (S::Slice(x), S::Slice(y)) => {
            let n = out.len().min(x.len()).min(y.len());
            let (x, y, out) = (&x[..n], &y[..n], &mut out[..n]);
            for i in 0..n {
                out[i] = f(x[i], y[i]);
            }
        }
        (S::Slice(x), S::Scalar(y)) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (S::Scalar(x), S::Slice(y)) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
        (S::Scalar(x), S::Scalar(y)) => out.fill(f(x, y)),
    }
}

#[inline(always)]
fn get<T: Copy>(s: S<'_, T>, i: usize) -> T {
    match s {
        S::Slice(x) => x[i],
        S::Scalar(x) => x,
    }
}

fn select<T: Copy>(p: S<'_, bool>, t: S<'_, T>, f: S<'_, T>, out: &mut [T]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = if get(p, i) { get(t, i) } else { get(f, i) };
    }
}

macro_rules! float_unary {
    ($u:expr, $a:expr, $out:expr) => {
        match $u {
            UnaryOp::Neg => map1($a, $out, |x| -x),
            UnaryOp::Abs => map1($a, $out, |x| x.abs()),
            UnaryOp::Exp => map1($a, $out, |x| x.exp()),
            UnaryOp::Log => map1($a, $out, |x| x.ln()),
            UnaryOp::Sqrt => map1($a, $out, |x| x.sqrt()),
            UnaryOp::Rsqrt => map1($a, $out, |x| x.rsqrt()),
            UnaryOp::Tanh => map1($a, $out, |x| x.tanh()),
            UnaryOp::Logistic => map1($a, $out, |x| 1.0 / (1.0 + (-x).exp())),
            UnaryOp::Sin => map1($a, $out, |x| x.sin()),
            UnaryOp::Cos => map1($a, $out, |x| x.cos()),
            UnaryOp::Floor => map1($a, $out, |x| x.floor()),
            UnaryOp::Ceil => map1($a, $out, |x| x.ceil()),
            UnaryOp::Sign => map1($a, $out, |x| {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            }),
            UnaryOp::Not => return Err(LoopError::FloatNot),
        }
    };
}

/// `$map(args…, f)` with the float op `$b` as `f`: one table of float
/// binary ops for the out-of-place (`map2`) and in-place (`map_in_place`)
/// loops.
macro_rules! float_binary {
    ($b:expr, $map:ident($($arg:expr),*)) => {
        match $b {
            BinaryOp::Add => $map($($arg,)* |a, b| a + b),
            BinaryOp::Sub => $map($($arg,)* |a, b| a - b),
            BinaryOp::Mul => $map($($arg,)* |a, b| a * b),
            BinaryOp::Div => $map($($arg,)* |a, b| a / b),
            BinaryOp::Rem => $map($($arg,)* |a, b| a % b),
            BinaryOp::Max => $map($($arg,)* float_max),
            BinaryOp::Min => $map($($arg,)* float_min),
            BinaryOp::Pow => $map($($arg,)* |a, b| a.powf(b)),
            BinaryOp::And | BinaryOp::Or => {
                return Err(LoopError::FloatLogic);
            }
        }
    };
}

macro_rules! compare {
    ($c:expr, $x:expr, $y:expr, $out:expr) => {
        match $c {
            CompareDir::Eq => map2($x, $y, $out, |a, b| a == b),
            CompareDir::Ne => map2($x, $y, $out, |a, b| a != b),
            CompareDir::Lt => map2($x, $y, $out, |a, b| a < b),
            CompareDir::Le => map2($x, $y, $out, |a, b| a <= b),
            CompareDir::Gt => map2($x, $y, $out, |a, b| a > b),
            CompareDir::Ge => map2($x, $y, $out, |a, b| a >= b),
        }
    };
}

/// Defines `$select() -> $ty`, which returns `$base` compiled for AVX-512
/// or AVX2 when this CPU has them (checked once, when the runtime is
/// built), else `$base` as compiled for the target.
macro_rules! cpu_dispatch {
    (
        $(#[$doc:meta])*
        $vis:vis $select:ident -> $ty:ty = $base:ident($($arg:ident: $argty:ty),* $(,)?)
    ) => {
        $(#[$doc])*
        $vis fn $select() -> $ty {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2")]
                unsafe fn avx512_inner($($arg: $argty),*) -> Result<(), LoopError> {
                    $base($($arg),*)
                }
                fn avx512($($arg: $argty),*) -> Result<(), LoopError> {
                    // SAFETY: only returned after detecting AVX-512F.
                    unsafe { avx512_inner($($arg),*) }
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2_inner($($arg: $argty),*) -> Result<(), LoopError> {
                    $base($($arg),*)
                }
                fn avx2($($arg: $argty),*) -> Result<(), LoopError> {
                    // SAFETY: only returned after detecting AVX2.
                    unsafe { avx2_inner($($arg),*) }
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return avx2;
                }
            }
            $base
        }
    };
}

/// One body instruction over one chunk, compiled for the best vector
/// extension the CPU has (selected once per process).
pub(super) type ExecFn = fn(&Op, &[Chunk<'_>], ChunkMut<'_>) -> Result<(), LoopError>;

cpu_dispatch!(
    /// The widest instruction set the loops were compiled for that this CPU
    /// runs. Rust never contracts `a * b + c` into an FMA, so every variant
    /// rounds exactly like the shared kernels.
    pub(super) select_exec -> ExecFn = exec(op: &Op, args: &[Chunk<'_>], out: ChunkMut<'_>)
);

/// A binary float op whose operand `dest_first ? 0 : 1` is its own
/// destination: `out[i] = op(out[i], other[i])` (or mirrored).
pub(super) type ExecInPlaceFn = fn(&Op, Chunk<'_>, bool, ChunkMut<'_>) -> Result<(), LoopError>;

cpu_dispatch!(
    /// [`exec_in_place`] for the widest instruction set this CPU runs.
    pub(super) select_exec_in_place -> ExecInPlaceFn =
        exec_in_place(op: &Op, b: Chunk<'_>, first: bool, out: ChunkMut<'_>)
);

#[inline(always)]
fn map_in_place<T: Copy>(out: &mut [T], other: S<'_, T>, first: bool, f: impl Fn(T, T) -> T) {
    match (other, first) {
        (S::Slice(y), true) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(*o, y);
            }
        }
        (S::Slice(y), false) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(y, *o);
            }
        }
        (S::Scalar(y), true) => out.iter_mut().for_each(|o| *o = f(*o, y)),
        (S::Scalar(y), false) => out.iter_mut().for_each(|o| *o = f(y, *o)),
    }
}

#[inline(always)]
fn exec_in_place(
    op: &Op,
    other: Chunk<'_>,
    first: bool,
    out: ChunkMut<'_>,
) -> Result<(), LoopError> {
    match (op, other, out) {
        (Op::Binary(b), Chunk::F32(y), ChunkMut::F32(o)) => {
            float_binary!(*b, map_in_place(o, y, first))
        }
        (Op::Binary(b), Chunk::F64(y), ChunkMut::F64(o)) => {
            float_binary!(*b, map_in_place(o, y, first))
        }
        _ => return Err(LoopError::InPlaceOperands(Box::new(op.clone()))),
    }
    Ok(())
}

/// `x * y` combined with `z` (`None`: the destination's own contents) by
/// add or subtract, the product first or second.
pub(super) type ExecProductFn =
    fn(Chunk<'_>, Chunk<'_>, Option<Chunk<'_>>, bool, bool, ChunkMut<'_>) -> Result<(), LoopError>;

cpu_dispatch!(
    /// [`exec_product`] for the widest instruction set this CPU runs.
    pub(super) select_exec_product -> ExecProductFn = exec_product(
        x: Chunk<'_>,
        y: Chunk<'_>,
        z: Option<Chunk<'_>>,
        first: bool,
        sub: bool,
        out: ChunkMut<'_>,
    )
);

/// The loops of a folded multiply, one per operand layout so each
/// vectorizes; `f(product, z)` applies the add or subtract.
#[inline(always)]
fn product_loop<T: Copy + std::ops::Mul<Output = T>>(
    x: S<'_, T>,
    y: S<'_, T>,
    z: Option<S<'_, T>>,
    out: &mut [T],
    f: impl Fn(T, T) -> T,
) -> Result<(), LoopError> {
    match (x, y, z) {
        (S::Scalar(x), S::Slice(y), Some(S::Slice(z))) => {
            for ((o, &y), &z) in out.iter_mut().zip(y).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Scalar(y), Some(S::Slice(z))) => {
            for ((o, &x), &z) in out.iter_mut().zip(x).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Slice(y), Some(S::Slice(z))) => {
            for (((o, &x), &y), &z) in out.iter_mut().zip(x).zip(y).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Scalar(x), S::Slice(y), Some(S::Scalar(z))) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Scalar(y), Some(S::Scalar(z))) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Slice(y), Some(S::Scalar(z))) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x * y, z);
            }
        }
        (S::Scalar(x), S::Slice(y), None) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x * y, *o);
            }
        }
        (S::Slice(x), S::Scalar(y), None) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x * y, *o);
            }
        }
        (S::Slice(x), S::Slice(y), None) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x * y, *o);
            }
        }
        _ => return Err(LoopError::ProductScalars),
    }
    Ok(())
}

macro_rules! product_ops {
    ($x:expr, $y:expr, $z:expr, $first:expr, $sub:expr, $o:expr) => {
        match ($first, $sub) {
            (true, false) => product_loop($x, $y, $z, $o, |m, z| m + z),
            (false, false) => product_loop($x, $y, $z, $o, |m, z| z + m),
            (true, true) => product_loop($x, $y, $z, $o, |m, z| m - z),
            (false, true) => product_loop($x, $y, $z, $o, |m, z| z - m),
        }
    };
}

#[inline(always)]
fn exec_product(
    x: Chunk<'_>,
    y: Chunk<'_>,
    z: Option<Chunk<'_>>,
    first: bool,
    sub: bool,
    out: ChunkMut<'_>,
) -> Result<(), LoopError> {
    match (x, y, z, out) {
        (Chunk::F32(x), Chunk::F32(y), Some(Chunk::F32(z)), ChunkMut::F32(o)) => {
            product_ops!(x, y, Some(z), first, sub, o)
        }
        (Chunk::F32(x), Chunk::F32(y), None, ChunkMut::F32(o)) => {
            product_ops!(x, y, None, first, sub, o)
        }
        (Chunk::F64(x), Chunk::F64(y), Some(Chunk::F64(z)), ChunkMut::F64(o)) => {
            product_ops!(x, y, Some(z), first, sub, o)
        }
        (Chunk::F64(x), Chunk::F64(y), None, ChunkMut::F64(o)) => {
            product_ops!(x, y, None, first, sub, o)
        }
        _ => Err(LoopError::ProductTypes),
    }
}

/// One body instruction over one chunk.
#[inline(always)]
fn exec(op: &Op, args: &[Chunk<'_>], out: ChunkMut<'_>) -> Result<(), LoopError> {
    match (op, args, out) {
        (Op::Unary(u), [Chunk::F32(a)], ChunkMut::F32(o)) => float_unary!(*u, *a, o),
        (Op::Unary(u), [Chunk::F64(a)], ChunkMut::F64(o)) => float_unary!(*u, *a, o),
        (Op::Unary(u), [Chunk::I32(a)], ChunkMut::I32(o)) => match u {
            UnaryOp::Neg => map1(*a, o, |x: i32| x.wrapping_neg()),
            UnaryOp::Abs => map1(*a, o, |x: i32| x.wrapping_abs()),
            UnaryOp::Sign => map1(*a, o, |x: i32| x.signum()),
            UnaryOp::Not => map1(*a, o, |x: i32| !x),
            UnaryOp::Floor | UnaryOp::Ceil => map1(*a, o, |x: i32| x),
            _ => return Err(LoopError::I32Unary(*u)),
        },
        (Op::Unary(UnaryOp::Not), [Chunk::Pred(a)], ChunkMut::Pred(o)) => map1(*a, o, |x| !x),
        (Op::Binary(b), [Chunk::F32(x), Chunk::F32(y)], ChunkMut::F32(o)) => {
            float_binary!(*b, map2(*x, *y, o))
        }
        (Op::Binary(b), [Chunk::F64(x), Chunk::F64(y)], ChunkMut::F64(o)) => {
            float_binary!(*b, map2(*x, *y, o))
        }
        (Op::Binary(b), [Chunk::I32(x), Chunk::I32(y)], ChunkMut::I32(o)) => {
            let (x, y) = (*x, *y);
            match b {
                BinaryOp::Add => map2(x, y, o, |a: i32, b: i32| a.wrapping_add(b)),
                BinaryOp::Sub => map2(x, y, o, |a: i32, b: i32| a.wrapping_sub(b)),
                BinaryOp::Mul => map2(x, y, o, |a: i32, b: i32| a.wrapping_mul(b)),
                BinaryOp::Div => map2(
                    x,
                    y,
                    o,
                    |a: i32, b: i32| {
                        if b == 0 { -1 } else { a.wrapping_div(b) }
                    },
                ),
                BinaryOp::Rem => map2(
                    x,
                    y,
                    o,
                    |a: i32, b: i32| {
                        if b == 0 { a } else { a.wrapping_rem(b) }
                    },
                ),
                BinaryOp::Max => map2(x, y, o, |a: i32, b: i32| a.max(b)),
                BinaryOp::Min => map2(x, y, o, |a: i32, b: i32| a.min(b)),
                BinaryOp::Pow => map2(x, y, o, int_pow),
                BinaryOp::And => map2(x, y, o, |a: i32, b: i32| a & b),
                BinaryOp::Or => map2(x, y, o, |a: i32, b: i32| a | b),
            }
        }
        (Op::Binary(b), [Chunk::Pred(x), Chunk::Pred(y)], ChunkMut::Pred(o)) => match b {
            BinaryOp::And | BinaryOp::Min => map2(*x, *y, o, |a: bool, b: bool| a & b),
            BinaryOp::Or | BinaryOp::Max => map2(*x, *y, o, |a: bool, b: bool| a | b),
            _ => return Err(LoopError::PredBinary(*b)),
        },
        (Op::Compare(c), [Chunk::F32(x), Chunk::F32(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::F64(x), Chunk::F64(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::I32(x), Chunk::I32(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::Pred(x), Chunk::Pred(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::F32(t), Chunk::F32(f)], ChunkMut::F32(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::F64(t), Chunk::F64(f)], ChunkMut::F64(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::I32(t), Chunk::I32(f)], ChunkMut::I32(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::Pred(t), Chunk::Pred(f)], ChunkMut::Pred(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Convert(_), [a], o) => convert(*a, o),
        _ => return Err(LoopError::Operands(Box::new(op.clone()))),
    }
    Ok(())
}

/// Elementwise conversion with the shared kernel's rules (float→int
/// truncates and saturates, NaN→0; pred↔number is 0/1 and `!= 0`).
fn convert(a: Chunk<'_>, out: ChunkMut<'_>) {
    match (a, out) {
        (Chunk::Pred(x), ChunkMut::Pred(o)) => map1(x, o, |v| v),
        (Chunk::Pred(x), ChunkMut::I32(o)) => map1(x, o, i32::from),
        (Chunk::Pred(x), ChunkMut::F32(o)) => map1(x, o, |v| f32::from(u8::from(v))),
        (Chunk::Pred(x), ChunkMut::F64(o)) => map1(x, o, |v| f64::from(u8::from(v))),
        (Chunk::I32(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0),
        (Chunk::I32(x), ChunkMut::I32(o)) => map1(x, o, |v| v),
        (Chunk::I32(x), ChunkMut::F32(o)) => map1(x, o, |v| v as f32),
        (Chunk::I32(x), ChunkMut::F64(o)) => map1(x, o, f64::from),
        (Chunk::F32(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0.0),
        (Chunk::F32(x), ChunkMut::I32(o)) => map1(x, o, |v| v as i32),
        (Chunk::F32(x), ChunkMut::F32(o)) => map1(x, o, |v| v),
        (Chunk::F32(x), ChunkMut::F64(o)) => map1(x, o, f64::from),
        (Chunk::F64(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0.0),
        (Chunk::F64(x), ChunkMut::I32(o)) => map1(x, o, |v| v as i32),
        (Chunk::F64(x), ChunkMut::F32(o)) => map1(x, o, |v| v as f32),
        (Chunk::F64(x), ChunkMut::F64(o)) => map1(x, o, |v| v),
    }
}
