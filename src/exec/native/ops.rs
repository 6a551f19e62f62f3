//! Emission of one body op over one step, vector or scalar, rounding
//! exactly like the shared kernels.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    BlockArg, ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value, types,
};
use cranelift_frontend::FunctionBuilder;
use smallvec::{SmallVec, smallvec};

use super::analysis::Float;
use super::isa::host_has_fma;
use crate::ir::{BinaryOp, CompareDir, Op, UnaryOp};

/// The `f32` inputs of [`Cx::rsqrt_f32x4_fma`]: `[2^-64, 2^64]`, where none
/// of its intermediate values is subnormal or overflows. Far wider than an
/// optimizer's `nu + eps` or `s + eps` needs.
const RSQRT_F32_FMA_RANGE: (f64, f64) = (1.0 / TWO_TO_64, TWO_TO_64);
const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;

/// A body value over one step: a float (one vector per part, or one
/// scalar in the tail) or a predicate mask of a float's width (lanes of all
/// ones / zeros for vectors, 0 / 1 in an `i8` for scalars).
#[derive(Clone)]
pub(super) enum V {
    Float(Float, SmallVec<[Value; 2]>),
    Mask(SmallVec<[Value; 2]>),
}

/// Emission context of one step: vector or scalar.
pub(super) struct Cx {
    pub(super) vector: bool,
}

fn floats_of(v: &V) -> &[Value] {
    match v {
        V::Float(_, parts) => parts,
        V::Mask(_) => unreachable!("analyze admits masks only where masks are read"),
    }
}

fn masks_of(v: &V) -> &[Value] {
    match v {
        V::Mask(parts) => parts,
        V::Float(..) => unreachable!("analyze admits floats only where floats are read"),
    }
}

impl Cx {
    /// The type of one part of a value of float `f`.
    fn ty(&self, f: Float) -> Type {
        if self.vector { f.vector() } else { f.scalar() }
    }

    /// `mask ? x : y`, lane by lane.
    fn choose(
        &self,
        b: &mut FunctionBuilder<'_>,
        ty: Type,
        mask: Value,
        x: Value,
        y: Value,
    ) -> Value {
        if self.vector {
            let m = b.ins().bitcast(
                ty,
                MemFlagsData::new().with_endianness(Endianness::Little),
                mask,
            );
            b.ins().bitselect(m, x, y)
        } else {
            b.ins().select(mask, x, y)
        }
    }

    fn constant(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: f64) -> Value {
        let s = if ty.lane_type() == types::F32 {
            b.ins().f32const(x as f32)
        } else {
            b.ins().f64const(x)
        };
        if self.vector { b.ins().splat(ty, s) } else { s }
    }

    /// [`float_max`](crate::kernels::elementwise::float_max) and
    /// `float_min` from compares: a NaN `y` wins, then a NaN `x`, then the
    /// comparison (`x` on ties, so `max(-0, +0)` is `-0` as in the kernels).
    fn nan_extremum(
        &self,
        b: &mut FunctionBuilder<'_>,
        ty: Type,
        x: Value,
        y: Value,
        cc: FloatCC,
    ) -> Value {
        let y_nan = b.ins().fcmp(FloatCC::Unordered, y, y);
        let x_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
        let wins = b.ins().fcmp(cc, x, y);
        let pick_x = b.ins().bor(x_nan, wins);
        let r = self.choose(b, ty, pick_x, x, y);
        self.choose(b, ty, y_nan, y, r)
    }

    fn unary(&self, b: &mut FunctionBuilder<'_>, u: UnaryOp, ty: Type, x: Value) -> Value {
        match u {
            UnaryOp::Neg => b.ins().fneg(x),
            UnaryOp::Abs => b.ins().fabs(x),
            UnaryOp::Sqrt => b.ins().sqrt(x),
            UnaryOp::Rsqrt => self.rsqrt(b, ty, x),
            UnaryOp::Floor => b.ins().floor(x),
            UnaryOp::Ceil => b.ins().ceil(x),
            UnaryOp::Sign => {
                let zero = self.constant(b, ty, 0.0);
                let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
                let is_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                let keep = b.ins().bor(is_zero, is_nan);
                let signum = copysign_one(b, ty, x);
                self.choose(b, ty, keep, x, signum)
            }
            _ => unreachable!("analyze admits only the unary ops above"),
        }
    }

    /// The correctly rounded `1 / sqrt(x)` of
    /// [`FloatElement::rsqrt`](crate::ir::FloatElement::rsqrt).
    ///
    /// `f64` is `1 / sqrt`. `f32` is, by definition, that in `f64` rounded
    /// once ([`Cx::rsqrt_via_f64`]); for an `f32x4` this is two `f64x2`
    /// square roots and two divisions per four lanes, and twice RMSProp's
    /// and Adagrad's streaming floor. Where the CPU has FMA, a vector whose
    /// four lanes all lie in [2^-64, 2^64] takes [`Cx::rsqrt_f32x4_fma`]
    /// instead, all in `f32` with the same bits; any other vector (a zero,
    /// an infinity, a NaN, a negative, a value out of that range) branches
    /// to the `f64` route.
    fn rsqrt(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        if ty.lane_type() == types::F64 {
            let one = self.constant(b, ty, 1.0);
            let root = b.ins().sqrt(x);
            return b.ins().fdiv(one, root);
        }
        if !self.vector || !host_has_fma() {
            return self.rsqrt_via_f64(b, ty, x);
        }
        let low = self.constant(b, ty, RSQRT_F32_FMA_RANGE.0);
        let high = self.constant(b, ty, RSQRT_F32_FMA_RANGE.1);
        // Unordered compares: a NaN lane is outside.
        let under = b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, low);
        let over = b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, high);
        let outside = b.ins().bor(under, over);
        let any_outside = b.ins().vany_true(outside);
        let (fast, slow, merge) = (b.create_block(), b.create_block(), b.create_block());
        b.append_block_param(merge, ty);
        b.ins().brif(any_outside, slow, &[], fast, &[]);
        b.switch_to_block(fast);
        let y = self.rsqrt_f32x4_fma(b, ty, x);
        b.ins().jump(merge, &[BlockArg::Value(y)]);
        b.switch_to_block(slow);
        let y = self.rsqrt_via_f64(b, ty, x);
        b.ins().jump(merge, &[BlockArg::Value(y)]);
        b.switch_to_block(merge);
        b.block_params(merge)[0]
    }

    /// `f32` `rsqrt` as its definition: `1 / sqrt` in `f64`, rounded once
    /// (scalar, or each `f32x4` as two `f64x2`).
    fn rsqrt_via_f64(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        let wide = self.convert(b, Float::F32, Float::F64, &[x]);
        let one = self.constant(b, self.ty(Float::F64), 1.0);
        let inverse: SmallVec<[Value; 2]> = wide
            .iter()
            .map(|&w| {
                let root = b.ins().sqrt(w);
                b.ins().fdiv(one, root)
            })
            .collect();
        debug_assert_eq!(ty.lane_type(), types::F32);
        self.convert(b, Float::F64, Float::F32, &inverse)[0]
    }

    /// Correctly rounded `f32x4` `rsqrt` for lanes in
    /// [`RSQRT_F32_FMA_RANGE`], in `f32` with FMA:
    ///
    /// ```text
    /// r = 1 / sqrt(x)                 // rounded twice: within one ulp
    /// h = r·r;  l = fma(r, r, -h)     // r² = h + l exactly
    /// e = fma(-l, x, fma(-h, x, 1))   // 1 - r²x
    /// y = fma(r·e, fma(e, 3/8, 1/2), r)   // r·(1 + e/2 + 3e²/8), rounded once
    /// ```
    ///
    /// Every rounding in it scales by exact powers of two across that
    /// range (nothing is subnormal or overflows), so the `f32`s in [1, 4)
    /// decide it: there, and over the whole range, it gives the bits of
    /// the `f64` route for every input (`tests/native_loops.rs` checks
    /// [1, 4) and, ignored, all 2^32 inputs; the sequence first differs at
    /// 2^105 and below 2^-127). It is four lanes per divider op where the
    /// `f64` route is two, and 9 vector ops against 13.
    fn rsqrt_f32x4_fma(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        let one = self.constant(b, ty, 1.0);
        let half = self.constant(b, ty, 0.5);
        let three_eighths = self.constant(b, ty, 0.375);
        let root = b.ins().sqrt(x);
        let r = b.ins().fdiv(one, root);
        let h = b.ins().fmul(r, r);
        let minus_h = b.ins().fneg(h);
        let l = b.ins().fma(r, r, minus_h);
        let minus_x = b.ins().fneg(x);
        let e = b.ins().fma(h, minus_x, one);
        let e = b.ins().fma(l, minus_x, e);
        let re = b.ins().fmul(r, e);
        let series = b.ins().fma(e, three_eighths, half);
        b.ins().fma(re, series, r)
    }

    fn binary(
        &self,
        b: &mut FunctionBuilder<'_>,
        op: BinaryOp,
        ty: Type,
        x: Value,
        y: Value,
    ) -> Value {
        match op {
            BinaryOp::Add => b.ins().fadd(x, y),
            BinaryOp::Sub => b.ins().fsub(x, y),
            BinaryOp::Mul => b.ins().fmul(x, y),
            BinaryOp::Div => b.ins().fdiv(x, y),
            BinaryOp::Max => self.nan_extremum(b, ty, x, y, FloatCC::GreaterThanOrEqual),
            BinaryOp::Min => self.nan_extremum(b, ty, x, y, FloatCC::LessThanOrEqual),
            _ => unreachable!("analyze admits only the binary ops above"),
        }
    }

    /// One instruction over all parts; `f` is its result's float (or the
    /// compared float, for masks).
    pub(super) fn op(&self, b: &mut FunctionBuilder<'_>, op: &Op, args: &[V], f: Float) -> V {
        let ty = self.ty(f);
        let zip2 = |b: &mut FunctionBuilder<'_>,
                    x: &[Value],
                    y: &[Value],
                    g: &dyn Fn(&mut FunctionBuilder<'_>, Value, Value) -> Value|
         -> SmallVec<[Value; 2]> {
            x.iter().zip(y).map(|(&x, &y)| g(b, x, y)).collect()
        };
        match op {
            Op::Unary(UnaryOp::Not) => V::Mask(
                masks_of(&args[0])
                    .iter()
                    .map(|&m| {
                        if self.vector {
                            b.ins().bnot(m)
                        } else {
                            b.ins().icmp_imm_u(IntCC::Equal, m, 0)
                        }
                    })
                    .collect(),
            ),
            Op::Unary(u) => V::Float(
                f,
                floats_of(&args[0])
                    .iter()
                    .map(|&x| self.unary(b, *u, ty, x))
                    .collect(),
            ),
            Op::Binary(BinaryOp::And) => V::Mask(zip2(
                b,
                masks_of(&args[0]),
                masks_of(&args[1]),
                &|b, x, y| b.ins().band(x, y),
            )),
            Op::Binary(BinaryOp::Or) => V::Mask(zip2(
                b,
                masks_of(&args[0]),
                masks_of(&args[1]),
                &|b, x, y| b.ins().bor(x, y),
            )),
            Op::Binary(op) => V::Float(
                f,
                zip2(b, floats_of(&args[0]), floats_of(&args[1]), &|b, x, y| {
                    self.binary(b, *op, ty, x, y)
                }),
            ),
            Op::Compare(dir) => {
                let cc = match dir {
                    CompareDir::Eq => FloatCC::Equal,
                    CompareDir::Ne => FloatCC::NotEqual,
                    CompareDir::Lt => FloatCC::LessThan,
                    CompareDir::Le => FloatCC::LessThanOrEqual,
                    CompareDir::Gt => FloatCC::GreaterThan,
                    CompareDir::Ge => FloatCC::GreaterThanOrEqual,
                };
                V::Mask(zip2(
                    b,
                    floats_of(&args[0]),
                    floats_of(&args[1]),
                    &|b, x, y| b.ins().fcmp(cc, x, y),
                ))
            }
            Op::Select => {
                let (m, t, e) = (masks_of(&args[0]), floats_of(&args[1]), floats_of(&args[2]));
                V::Float(
                    f,
                    m.iter()
                        .zip(t)
                        .zip(e)
                        .map(|((&m, &t), &e)| self.choose(b, ty, m, t, e))
                        .collect(),
                )
            }
            Op::Convert(_) => {
                let V::Float(from, parts) = &args[0] else {
                    unreachable!("analyze admits conversions of floats only")
                };
                V::Float(f, self.convert(b, *from, f, parts))
            }
            _ => unreachable!("analyze admits only the ops above"),
        }
    }

    /// Converts between `f32` and `f64`: one `f32x4` is two `f64x2`.
    fn convert(
        &self,
        b: &mut FunctionBuilder<'_>,
        from: Float,
        to: Float,
        x: &[Value],
    ) -> SmallVec<[Value; 2]> {
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        match (from, to, self.vector) {
            (a, b2, _) if a == b2 => x.into(),
            (Float::F32, Float::F64, false) => smallvec![b.ins().fpromote(types::F64, x[0])],
            (Float::F64, Float::F32, false) => smallvec![b.ins().fdemote(types::F32, x[0])],
            (Float::F32, Float::F64, true) => {
                let low = b.ins().fvpromote_low(x[0]);
                // Lanes 2 and 3 moved down to 0 and 1.
                let bytes = b.ins().bitcast(types::I8X16, le, x[0]);
                let mask: Vec<u8> = (8..16).chain(8..16).collect();
                let mask = b.func.dfg.immediates.push(ConstantData::from(mask));
                let high = b.ins().shuffle(bytes, bytes, mask);
                let high = b.ins().bitcast(types::F32X4, le, high);
                let high = b.ins().fvpromote_low(high);
                smallvec![low, high]
            }
            (Float::F64, Float::F32, true) => {
                // Each demotion fills lanes 0 and 1; join the two halves.
                let low = b.ins().fvdemote(x[0]);
                let high = b.ins().fvdemote(x[1]);
                let low = b.ins().bitcast(types::I8X16, le, low);
                let high = b.ins().bitcast(types::I8X16, le, high);
                let mask: Vec<u8> = (0..8).chain(16..24).collect();
                let mask = b.func.dfg.immediates.push(ConstantData::from(mask));
                let joined = b.ins().shuffle(low, high, mask);
                smallvec![b.ins().bitcast(types::F32X4, le, joined)]
            }
            _ => unreachable!("f32 and f64 are the only floats"),
        }
    }
}

/// `1.0` with the sign of `x`, through the bits (Cranelift's x86-64
/// backend has no vector `fcopysign`).
fn copysign_one(b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
    let (int, sign, one) = if ty.lane_type() == types::F32 {
        (types::I32, i64::from(i32::MIN), i64::from(1.0f32.to_bits()))
    } else {
        (types::I64, i64::MIN, 1.0f64.to_bits() as i64)
    };
    let ity = ty.as_int();
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    let splat = |b: &mut FunctionBuilder<'_>, v: i64| {
        let s = b.ins().iconst(int, v);
        if ity.is_vector() {
            b.ins().splat(ity, s)
        } else {
            s
        }
    };
    let (sign, one) = (splat(b, sign), splat(b, one));
    let bits = b.ins().bitcast(ity, flags, x);
    let bits = b.ins().band(bits, sign);
    let bits = b.ins().bor(bits, one);
    b.ins().bitcast(ty, flags, bits)
}
