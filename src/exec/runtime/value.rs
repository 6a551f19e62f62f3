//! The values of a run: the type and address of each buffer's tensor, and
//! reading, copying and allocating them.

use std::borrow::Cow;

use ndarray::{ArrayD, IxDyn};
use smallvec::SmallVec;

use super::ExecError;
use crate::compiler::executable::{Executable, ValueRef};
use crate::ir::{DType, Element, Tensor, TensorType};

/// The data address of a standard-layout tensor (making it standard first).
pub(super) fn tensor_ptr_mut(t: &mut Tensor) -> usize {
    macro_rules! std_ptr {
        ($a:expr) => {{
            if !$a.is_standard_layout() {
                *$a = $a.as_standard_layout().into_owned();
            }
            $a.as_mut_ptr() as usize
        }};
    }
    match t {
        Tensor::Pred(a) => std_ptr!(a),
        Tensor::I32(a) => std_ptr!(a),
        Tensor::F32(a) => std_ptr!(a),
        Tensor::F64(a) => std_ptr!(a),
    }
}

/// The data address of a standard-layout tensor, if it is one.
pub(super) fn tensor_ptr(t: &Tensor) -> Option<usize> {
    match t {
        Tensor::Pred(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::I32(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::F32(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::F64(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
    }
}

/// The type of a run's value, kept inline: a step builds one per argument,
/// and at 1e3 elements a heap-allocated shape per argument costs as much as
/// the arithmetic.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ValueType {
    pub(super) dtype: DType,
    pub(super) dims: SmallVec<[usize; 4]>,
}

impl ValueType {
    pub(super) fn new(dtype: DType, dims: &[usize]) -> ValueType {
        ValueType {
            dtype,
            dims: SmallVec::from_slice(dims),
        }
    }

    pub(super) fn of(t: &Tensor) -> ValueType {
        ValueType::new(t.dtype(), t.shape())
    }

    pub(super) fn from_type(ty: &TensorType) -> ValueType {
        ValueType::new(ty.dtype, &ty.dims)
    }

    pub(super) fn element_count(&self) -> usize {
        self.dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Whether this is `ty` (compared element by element: the shapes are a
    /// few words, shorter than a call to `memcmp`).
    pub(super) fn is(&self, ty: &TensorType) -> bool {
        self.dtype == ty.dtype
            && self.dims.len() == ty.dims.len()
            && self.dims.iter().zip(&ty.dims).all(|(a, b)| a == b)
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        TensorType::new(self.dtype, self.dims.to_vec()).fmt(f)
    }
}

/// A value of the runtime: a tensor in a buffer slot.
pub(super) struct Slot {
    pub(super) ty: ValueType,
    pub(super) ptr: usize,
    pub(super) writable: bool,
    pub(super) owned: Option<Box<Tensor>>,
    /// The argument whose buffer this is, while it holds that argument.
    pub(super) arg: Option<usize>,
}

impl Slot {
    pub(super) fn from_tensor(mut t: Tensor) -> Slot {
        let ptr = tensor_ptr_mut(&mut t);
        Slot {
            ty: ValueType::of(&t),
            ptr,
            writable: true,
            owned: Some(Box::new(t)),
            arg: None,
        }
    }

    /// The value as a tensor: borrowed when owned, copied from a borrow.
    pub(super) fn tensor(&self) -> Cow<'_, Tensor> {
        match &self.owned {
            Some(t) => Cow::Borrowed(&**t),
            None => Cow::Owned(copy_raw(&self.ty, self.ptr)),
        }
    }
}

/// A copy of the `ty` value at `ptr` as a tensor.
pub(super) fn copy_raw(ty: &ValueType, ptr: usize) -> Tensor {
    fn copy<T: Element>(ty: &ValueType, ptr: usize) -> Tensor {
        let n = ty.element_count();
        // SAFETY: `ptr` addresses `n` initialised elements of `T` that the
        // run borrows for its whole duration (see `Arg`).
        let s = unsafe { std::slice::from_raw_parts(ptr as *const T, n) };
        T::into_tensor(ArrayD::from_shape_vec(IxDyn(&ty.dims), s.to_vec()).expect("sizes match"))
    }
    match ty.dtype {
        DType::Pred => copy::<bool>(ty, ptr),
        DType::I32 => copy::<i32>(ty, ptr),
        DType::F32 => copy::<f32>(ty, ptr),
        DType::F64 => copy::<f64>(ty, ptr),
    }
}

/// A freshly allocated tensor of `ty` whose elements the caller writes
/// before anyone reads them; `(tensor, data address)`.
pub(super) fn fresh(ty: &ValueType) -> (Tensor, usize) {
    fn make<T: Element>(ty: &ValueType) -> (Tensor, usize) {
        let n = ty.element_count();
        let mut v = crate::memory::output_buffer::<T>(n);
        // SAFETY: `fresh` is only called for the outputs of a fused loop,
        // which writes every element `[0, n)` before anything reads the
        // buffer; if the loop fails the tensor is dropped unread (dropping
        // plain-old-data elements reads nothing).
        unsafe { v.set_len(n) };
        let ptr = v.as_mut_ptr() as usize;
        let t = T::into_tensor(ArrayD::from_shape_vec(IxDyn(&ty.dims), v).expect("sizes match"));
        (t, ptr)
    }
    match ty.dtype {
        DType::Pred => make::<bool>(ty),
        DType::I32 => make::<i32>(ty),
        DType::F32 => make::<f32>(ty),
        DType::F64 => make::<f64>(ty),
    }
}

/// A read of buffer `b` before any kernel wrote it.
pub(super) fn unwritten(b: u32) -> ExecError {
    ExecError::Arguments(format!("buffer {b} is read before it is written"))
}

/// The value of a kernel input as a tensor (borrowed, or copied from a
/// borrowed argument).
pub(super) fn read<'s>(
    exe: &'s Executable,
    slots: &'s [Option<Slot>],
    r: ValueRef,
) -> Result<Cow<'s, Tensor>, ExecError> {
    match r {
        ValueRef::Constant(c) => Ok(Cow::Borrowed(&exe.constants[c as usize])),
        ValueRef::Buffer(b) => Ok(slots[b as usize]
            .as_ref()
            .ok_or_else(|| unwritten(b))?
            .tensor()),
    }
}
