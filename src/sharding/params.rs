//! [`ParamSet`]: a model's parameters (or one replica's gradients) as named
//! tensors in a fixed order, the unit a sharded optimizer steps.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::error::ShardingError;
use crate::ir::FloatElement;

/// Named tensors of one element type, in insertion order (the order the
/// model is packed into buckets). Names are unique; every tensor has at
/// least one element and is kept in standard (row-major) layout.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSet<A> {
    tensors: Vec<(String, ArrayD<A>)>,
}

impl<A> Default for ParamSet<A> {
    fn default() -> Self {
        ParamSet {
            tensors: Vec::new(),
        }
    }
}

impl<A: FloatElement> ParamSet<A> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tensor` as `name` (a non-standard-layout array is copied into
    /// standard layout once). A duplicate name or an empty tensor is an
    /// error.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        tensor: impl Into<ArrayD<A>>,
    ) -> Result<(), ShardingError> {
        let name = name.into();
        let tensor: ArrayD<A> = tensor.into();
        if self.tensors.iter().any(|(n, _)| *n == name) {
            return Err(ShardingError::DuplicateTensor { name });
        }
        if tensor.is_empty() {
            return Err(ShardingError::EmptyTensor {
                name,
                shape: tensor.shape().to_vec(),
            });
        }
        let tensor = if tensor.is_standard_layout() {
            tensor
        } else {
            tensor.as_standard_layout().into_owned()
        };
        self.tensors.push((name, tensor));
        Ok(())
    }

    /// A set of `tensors`, in the order given, with the checks of
    /// [`ParamSet::insert`]: the first duplicate name or empty tensor ends
    /// the build with `insert`'s error, which names it.
    ///
    /// There is no `FromIterator` (so no `collect()`): it could only
    /// report a bad tensor by panicking.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use optirs_tpu::sharding::ParamSet;
    ///
    /// let params = ParamSet::try_from_iter([
    ///     ("w", ArrayD::from_elem(IxDyn(&[4, 4]), 0.5f32)),
    ///     ("b", ArrayD::zeros(IxDyn(&[4]))),
    /// ])?;
    /// assert_eq!(params.names().collect::<Vec<_>>(), ["w", "b"]);
    ///
    /// let error = ParamSet::try_from_iter([
    ///     ("w", ArrayD::from_elem(IxDyn(&[4]), 0.5f32)),
    ///     ("empty", ArrayD::zeros(IxDyn(&[0]))),
    /// ])
    /// .unwrap_err();
    /// assert!(error.to_string().contains("`empty`"), "{error}");
    /// # Ok::<(), optirs_tpu::sharding::ShardingError>(())
    /// ```
    pub fn try_from_iter(
        tensors: impl IntoIterator<Item = (impl Into<String>, ArrayD<A>)>,
    ) -> Result<Self, ShardingError> {
        let mut set = ParamSet::new();
        for (name, tensor) in tensors {
            set.insert(name, tensor)?;
        }
        Ok(set)
    }

    /// [`ParamSet::insert`], chained.
    pub fn with(
        mut self,
        name: impl Into<String>,
        tensor: impl Into<ArrayD<A>>,
    ) -> Result<Self, ShardingError> {
        self.insert(name, tensor)?;
        Ok(self)
    }

    /// A set of zero tensors of the given names and shapes.
    pub fn zeros(shapes: &[(&str, &[usize])]) -> Result<Self, ShardingError> {
        let mut set = ParamSet::new();
        for (name, shape) in shapes {
            set.insert(*name, ArrayD::from_elem(IxDyn(shape), A::ZERO))?;
        }
        Ok(set)
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&ArrayD<A>> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The tensor `name`, to change in place.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut ArrayD<A>> {
        self.tensors
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// Names and tensors, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, ArrayViewD<'_, A>)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t.view()))
    }

    /// Names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(n, _)| n.as_str())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the set has no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Elements over every tensor.
    pub fn elements(&self) -> usize {
        self.tensors.iter().map(|(_, t)| t.len()).sum()
    }

    /// Names and shapes, in order.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.shape().to_vec()))
            .collect()
    }

    /// Every element, tensor after tensor in order, row-major within each.
    pub fn to_flat(&self) -> Vec<A> {
        let mut flat = Vec::with_capacity(self.elements());
        for (_, t) in &self.tensors {
            flat.extend_from_slice(t.as_slice().expect("kept in standard layout"));
        }
        flat
    }

    /// The tensors' elements as one slice each, in order (standard layout).
    pub(crate) fn slices(&self) -> impl Iterator<Item = &[A]> {
        self.tensors
            .iter()
            .map(|(_, t)| t.as_slice().expect("kept in standard layout"))
    }
}
