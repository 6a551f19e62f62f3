//! How a model is packed into buckets and split over the devices.
//!
//! The model's tensors are laid end to end, in order, as one flat vector
//! of `elements` values. It is cut into buckets of `bucket_elements` each
//! (the configured bucket bytes, rounded down to a multiple of the device
//! count `n`; the last bucket is shorter). A bucket is padded at its end to
//! a multiple of `n` (at most `n − 1` padding elements, only in the last
//! bucket; their gradients are zero and their values never leave the
//! device), so every device owns exactly `padded_len / n` elements of every
//! bucket, and every bucket of one length runs one compiled program. Since
//! only the last bucket is padded, element `i` of the model sits at index
//! `i` of the padded vector too.
//!
//! Under a mesh whose `data` axis replicates the state (zero2 and fsdp with
//! `data > 1`, [`ShardLayout::on_mesh`]) every bucket is cut into one shard
//! per device of the `fsdp` group instead, and the devices that differ only
//! along the data axes own the same shard: the first of them (the
//! *primary*) holds its state values, the others charge their HBM for a
//! replica of it (values stored once, as the parameters are).
//!
//! Which part of a bucket a device owns follows the collective that
//! reduces it: over a whole torus, the reduce-scatter's dimension-order
//! chunks ([`torus_shard_ranges`]); over a multislice pod the same on the
//! grid with the slice index as a last axis (the hierarchical
//! reduce-scatter's chunks); over the survivors of a failure, the ring
//! position.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::error::ShardingError;
use crate::collectives::{ReduceGrid, TorusShape, torus_shard_ranges};
use crate::ir::DType;
use crate::topology::DeviceId;

/// One tensor of the model: where its elements start in the flat vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Index of its first element in the flat model.
    pub offset: usize,
}

impl TensorSpec {
    /// Elements of the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements (never, in a built layout).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A contiguous run of the flat model that moves and updates as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// First element (in the flat model and the padded vector alike).
    pub offset: usize,
    /// Model elements in the bucket.
    pub len: usize,
    /// `len` padded to a multiple of the device count.
    pub padded_len: usize,
    /// Elements each device owns: `padded_len` over the shard count
    /// ([`ShardLayout::shards`]: `n`, or the fsdp group's size).
    pub shard_len: usize,
    /// Where this bucket's shard starts in each device's state vector.
    pub shard_offset: usize,
}

/// The collective the gradients are reduce-scattered with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardPlan {
    /// Over the slice's whole torus, dimension by dimension; device id `d`
    /// is torus index `d`.
    Torus {
        /// Extents.
        dims: Vec<usize>,
        /// Wraparound per dimension.
        wraparound: Vec<bool>,
    },
    /// Over a ring of the participants (the snake ring through the torus
    /// without the excluded devices), each hop routed on the torus.
    Ring {
        /// Devices in ring order.
        ring: Vec<DeviceId>,
    },
    /// Over every device of a multislice pod, hierarchically: the slice's
    /// torus dimension by dimension over ICI, then across the slices over
    /// DCN ([`crate::collectives::multislice`]); device id `d` is index `d`
    /// of the grid `dims ++ [slices]`.
    Multislice {
        /// One slice's extents, padded to 3 dimensions.
        dims: Vec<usize>,
        /// Wraparound per slice dimension.
        wraparound: Vec<bool>,
        /// Slices.
        slices: usize,
    },
}

impl ShardPlan {
    /// The grid a torus or multislice plan reduces on (a multislice plan's
    /// slice axis last); `None` for a ring.
    pub fn grid_shape(&self) -> Option<TorusShape> {
        match self {
            ShardPlan::Torus { dims, wraparound } => TorusShape::new(dims, wraparound).ok(),
            ShardPlan::Multislice {
                dims,
                wraparound,
                slices,
            } => {
                let mut dims = dims.clone();
                let mut wraparound = wraparound.clone();
                dims.push(*slices);
                wraparound.push(true);
                TorusShape::new(&dims, &wraparound).ok()
            }
            ShardPlan::Ring { .. } => None,
        }
    }
}

/// The packing and sharding of one model over one set of devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// Element type.
    pub dtype: DType,
    /// The tensors, in model order.
    pub tensors: Vec<TensorSpec>,
    /// Elements of the model.
    pub elements: usize,
    /// Elements of every bucket but the last.
    pub bucket_elements: usize,
    /// The buckets, in order.
    pub buckets: Vec<Bucket>,
    /// The devices, sorted by id; replica `r` of a step is `participants[r]`.
    pub participants: Vec<DeviceId>,
    /// `shard_index[r]`: which shard of every bucket `participants[r]`
    /// owns (devices along a replicating data axis share one).
    pub shard_index: Vec<usize>,
    /// How gradients are reduced.
    pub plan: ShardPlan,
}

impl ShardLayout {
    /// Packs `tensors` (names and shapes, in order) of `dtype` into buckets
    /// of about `bucket_bytes` and shards them over `participants` with
    /// `plan`.
    pub fn new(
        dtype: DType,
        tensors: &[(String, Vec<usize>)],
        bucket_bytes: usize,
        participants: Vec<DeviceId>,
        plan: ShardPlan,
    ) -> Result<ShardLayout, ShardingError> {
        ShardLayout::on_mesh(dtype, tensors, bucket_bytes, participants, plan, &[])
    }

    /// [`ShardLayout::new`] with the state replicated along `data_axes`
    /// (axes of the plan's grid, [`ShardPlan::grid_shape`]; a multislice
    /// plan's slices are its last): every bucket is cut into one shard per
    /// position on the other axes, in their reduce-scatter's order, and the
    /// devices that differ only along `data_axes` own the same shard.
    /// Buckets are padded to a multiple of every device as without them, so
    /// a model has the same buckets on every mesh.
    pub fn on_mesh(
        dtype: DType,
        tensors: &[(String, Vec<usize>)],
        bucket_bytes: usize,
        participants: Vec<DeviceId>,
        plan: ShardPlan,
        data_axes: &[usize],
    ) -> Result<ShardLayout, ShardingError> {
        if tensors.is_empty() {
            return Err(ShardingError::EmptyModel);
        }
        let elem = dtype.byte_size();
        if bucket_bytes < elem {
            return Err(ShardingError::BucketBytes {
                bytes: bucket_bytes,
                dtype: dtype.to_string(),
                min: elem,
            });
        }
        let n = participants.len();
        if n == 0 {
            return Err(ShardingError::Devices {
                reason: "a sharded model needs at least one device".into(),
            });
        }
        let mut specs = Vec::with_capacity(tensors.len());
        let mut offset = 0usize;
        for (name, shape) in tensors {
            if specs.iter().any(|s: &TensorSpec| s.name == *name) {
                return Err(ShardingError::DuplicateTensor { name: name.clone() });
            }
            let len = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or(ShardingError::TooLarge {
                    elements: u128::MAX,
                })?;
            if len == 0 {
                return Err(ShardingError::EmptyTensor {
                    name: name.clone(),
                    shape: shape.clone(),
                });
            }
            specs.push(TensorSpec {
                name: name.clone(),
                shape: shape.clone(),
                offset,
            });
            offset = offset.checked_add(len).ok_or(ShardingError::TooLarge {
                elements: offset as u128 + len as u128,
            })?;
        }
        let elements = offset;
        let shard_index = shard_indices(&participants, &plan, data_axes)?;
        let shards = shard_index.iter().max().map_or(1, |&k| k + 1);
        let bucket_elements = ((bucket_bytes / elem) / n * n).max(n);
        let mut buckets = Vec::with_capacity(elements.div_ceil(bucket_elements));
        let mut start = 0;
        let mut shard_offset = 0;
        while start < elements {
            let len = bucket_elements.min(elements - start);
            let padded_len = len.next_multiple_of(n);
            buckets.push(Bucket {
                offset: start,
                len,
                padded_len,
                shard_len: padded_len / shards,
                shard_offset,
            });
            shard_offset += padded_len / shards;
            start += len;
        }
        Ok(ShardLayout {
            dtype,
            tensors: specs,
            elements,
            bucket_elements,
            buckets,
            participants,
            shard_index,
            plan,
        })
    }

    /// The same tensors and bucket size over other devices.
    pub fn reshard(
        &self,
        participants: Vec<DeviceId>,
        plan: ShardPlan,
        bucket_bytes: usize,
    ) -> Result<ShardLayout, ShardingError> {
        let tensors: Vec<(String, Vec<usize>)> = self
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        ShardLayout::new(self.dtype, &tensors, bucket_bytes, participants, plan)
    }

    /// Devices the model is sharded over.
    pub fn devices(&self) -> usize {
        self.participants.len()
    }

    /// Shards of every bucket: the device count, or under a replicating
    /// data axis the fsdp group's size.
    pub fn shards(&self) -> usize {
        self.buckets
            .first()
            .map_or(self.devices(), |b| b.padded_len / b.shard_len.max(1))
    }

    /// Whether devices along a data axis share shards ([`ShardLayout::on_mesh`]).
    pub fn is_mirrored(&self) -> bool {
        self.shards() < self.devices()
    }

    /// Per shard, the replica that holds its state values: the first that
    /// owns it.
    pub fn primaries(&self) -> Vec<usize> {
        let mut primary = vec![usize::MAX; self.shards()];
        for (r, &k) in self.shard_index.iter().enumerate() {
            if primary[k] == usize::MAX {
                primary[k] = r;
            }
        }
        primary
    }

    /// `values` (a model's flat parameters or one state slot, of this or
    /// another layout) as this layout holds them: the model's elements,
    /// then `zero` to the padded length.
    pub fn fit_padded<T: Clone>(&self, mut values: Vec<T>, zero: T) -> Vec<T> {
        values.truncate(self.elements);
        values.resize(self.padded_elements(), zero);
        values
    }

    /// Length of the padded flat vector.
    pub fn padded_elements(&self) -> usize {
        self.buckets.last().map_or(0, |b| b.offset + b.padded_len)
    }

    /// Elements of each device's state vector (its shards of every bucket).
    pub fn shard_elements(&self) -> usize {
        self.buckets.iter().map(|b| b.shard_len).sum()
    }

    /// Bytes of one element.
    pub fn element_bytes(&self) -> usize {
        self.dtype.byte_size()
    }

    /// The padded-vector range of bucket `b` that replica `r` owns.
    pub fn shard_range(&self, r: usize, b: usize) -> Range<usize> {
        let bucket = &self.buckets[b];
        let start = bucket.offset + self.shard_index[r] * bucket.shard_len;
        start..start + bucket.shard_len
    }

    /// A padded flat buffer cut into its shards, bucket by bucket:
    /// `(bucket, owning replica (the primary), the shard's slice)`.
    pub fn shards_of<'a, T>(&self, padded: &'a mut [T]) -> Vec<(usize, usize, &'a mut [T])> {
        let replica_of_shard = self.primaries();
        let mut shards = Vec::with_capacity(self.buckets.len() * self.shards());
        let mut rest = padded;
        for (b, bucket) in self.buckets.iter().enumerate() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(bucket.padded_len);
            for (k, shard) in head.chunks_mut(bucket.shard_len).enumerate() {
                shards.push((b, replica_of_shard[k], shard));
            }
            rest = tail;
        }
        shards
    }

    /// A padded flat buffer cut as the whole grid's reduce-scatter owns
    /// it, bucket by bucket: `(replica, start in the padded vector, the
    /// chunk)`, every bucket in `n` chunks of `padded_len / n`. The
    /// gradient reduction folds each chunk in its owner's order
    /// ([`ShardLayout::grid`]), so an element is reduced in one order
    /// whatever the mesh replicates: a mirrored layout's shard is several
    /// of these chunks.
    pub fn reduction_chunks<'a, T>(&self, padded: &'a mut [T]) -> Vec<(usize, usize, &'a mut [T])> {
        let n = self.devices();
        let full = if self.is_mirrored() {
            full_shard_indices(&self.participants, &self.plan)
                .unwrap_or_else(|_| self.shard_index.clone())
        } else {
            self.shard_index.clone()
        };
        let mut replica_of_chunk = vec![0usize; n];
        for (r, &k) in full.iter().enumerate() {
            replica_of_chunk[k] = r;
        }
        let mut chunks = Vec::with_capacity(self.buckets.len() * n);
        let mut rest = padded;
        for bucket in &self.buckets {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(bucket.padded_len);
            let len = bucket.padded_len / n;
            for (k, chunk) in head.chunks_mut(len.max(1)).enumerate() {
                chunks.push((replica_of_chunk[k], bucket.offset + k * len, chunk));
            }
            rest = tail;
        }
        chunks
    }

    /// The replica (participant index) of a device.
    pub fn replica_of(&self, device: DeviceId) -> Option<usize> {
        self.participants.binary_search(&device).ok()
    }

    /// The grid the reduce-scatter folds on (members are device ids) and,
    /// per replica, its position on it.
    pub fn grid(&self) -> (ReduceGrid, Vec<usize>) {
        match &self.plan {
            ShardPlan::Torus { .. } | ShardPlan::Multislice { .. } => (
                ReduceGrid::torus(
                    &self
                        .plan
                        .grid_shape()
                        .map(|s| s.dims().to_vec())
                        .unwrap_or_default(),
                ),
                self.participants.iter().map(|d| d.0 as usize).collect(),
            ),
            // On a ring a replica's shard is its ring position.
            ShardPlan::Ring { ring } => {
                let members: Vec<usize> = ring.iter().map(|d| d.0 as usize).collect();
                (ReduceGrid::ring(&members), self.shard_index.clone())
            }
        }
    }

    /// The participants in ring order: the plan's ring, or the snake ring
    /// through the torus (each hop one link but the closing one); for a
    /// multislice plan, each slice's snake ring, slice after slice.
    pub fn ring_order(&self) -> Vec<DeviceId> {
        match &self.plan {
            ShardPlan::Multislice { slices, .. } => {
                let rings = self.slice_rings();
                (0..*slices).flat_map(rings).collect()
            }
            ShardPlan::Torus { dims, wraparound } => TorusShape::new(dims, wraparound)
                .map(|s| {
                    s.snake_ring()
                        .into_iter()
                        .map(|d| DeviceId(d as u32))
                        .collect()
                })
                .unwrap_or_else(|_| self.participants.clone()),
            ShardPlan::Ring { ring } => ring.clone(),
        }
    }

    /// A multislice plan's snake ring of slice `s` (device ids); empty for
    /// other plans.
    fn slice_rings(&self) -> impl Fn(usize) -> Vec<DeviceId> + '_ {
        let slice = match &self.plan {
            ShardPlan::Multislice {
                dims, wraparound, ..
            } => TorusShape::new(dims, wraparound).ok(),
            _ => None,
        };
        move |s| {
            slice.as_ref().map_or_else(Vec::new, |shape| {
                let base = s * shape.device_count();
                shape
                    .snake_ring()
                    .into_iter()
                    .map(|d| DeviceId((base + d) as u32))
                    .collect()
            })
        }
    }

    /// Per replica, the replica that holds its redundant state copy: its
    /// successor in [`ShardLayout::ring_order`] (on a multislice plan, in
    /// its own slice's ring, so the copy moves over ICI).
    pub fn peers(&self) -> Vec<usize> {
        if let ShardPlan::Multislice { slices, .. } = &self.plan {
            let rings = self.slice_rings();
            let mut peers: Vec<usize> = (0..self.devices()).collect();
            for s in 0..*slices {
                let ring = rings(s);
                for (at, &device) in ring.iter().enumerate() {
                    let next = ring[(at + 1) % ring.len()];
                    if let (Some(r), Some(peer)) = (self.replica_of(device), self.replica_of(next))
                    {
                        peers[r] = peer;
                    }
                }
            }
            return peers;
        }
        let ring = self.ring_order();
        let mut peers: Vec<usize> = (0..self.devices()).collect();
        for (at, &device) in ring.iter().enumerate() {
            let next = ring[(at + 1) % ring.len()];
            if let (Some(r), Some(peer)) = (self.replica_of(device), self.replica_of(next)) {
                peers[r] = peer;
            }
        }
        peers
    }

    /// The torus shape of a [`ShardPlan::Torus`].
    pub fn torus(&self) -> Option<TorusShape> {
        match &self.plan {
            ShardPlan::Torus { dims, wraparound } => TorusShape::new(dims, wraparound).ok(),
            ShardPlan::Ring { .. } | ShardPlan::Multislice { .. } => None,
        }
    }
}

/// Which shard of a bucket each participant owns under `plan`, the state
/// replicated along `data_axes` of its grid.
fn shard_indices(
    participants: &[DeviceId],
    plan: &ShardPlan,
    data_axes: &[usize],
) -> Result<Vec<usize>, ShardingError> {
    let full = full_shard_indices(participants, plan)?;
    if data_axes.is_empty() {
        return Ok(full);
    }
    let shape = plan.grid_shape().ok_or_else(|| ShardingError::Devices {
        reason: "a data axis that replicates the state needs a torus or multislice plan, \
                 not a ring of survivors"
            .into(),
    })?;
    let dims = shape.dims();
    if let Some(&bad) = data_axes.iter().find(|&&a| a >= dims.len()) {
        return Err(ShardingError::Devices {
            reason: format!("data axis {bad} is not an axis of the grid {dims:?}"),
        });
    }
    // The fsdp group: the grid without the data axes, in its own
    // reduce-scatter's order.
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !data_axes.contains(a)).collect();
    let sub_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    let sub_wrap: Vec<bool> = kept.iter().map(|&a| shape.wraparound()[a]).collect();
    let (sub_dims, sub_wrap) = if sub_dims.is_empty() {
        (vec![1], vec![false])
    } else {
        (sub_dims, sub_wrap)
    };
    let sub = TorusShape::new(&sub_dims, &sub_wrap).map_err(|e| ShardingError::Devices {
        reason: format!("the fsdp group {sub_dims:?}: {e}"),
    })?;
    let owned = torus_shard_ranges(&sub, sub.device_count());
    Ok(participants
        .iter()
        .map(|d| {
            let coords = shape.coords(d.0 as usize);
            let at: Vec<usize> = kept.iter().map(|&a| coords[a]).collect();
            let at = if at.is_empty() { vec![0] } else { at };
            sub.index(&at).map_or(0, |i| owned[i].start)
        })
        .collect())
}

/// Which `1/n` of a bucket each participant owns under `plan`.
fn full_shard_indices(
    participants: &[DeviceId],
    plan: &ShardPlan,
) -> Result<Vec<usize>, ShardingError> {
    let n = participants.len();
    match plan {
        ShardPlan::Torus { dims, .. } | ShardPlan::Multislice { dims, .. } => {
            let shape = plan.grid_shape().ok_or_else(|| ShardingError::Devices {
                reason: format!("{plan:?} is not a valid torus or multislice shape"),
            })?;
            let all: Vec<DeviceId> = (0..shape.device_count() as u32).map(DeviceId).collect();
            if participants != all.as_slice() {
                return Err(ShardingError::Devices {
                    reason: format!(
                        "a {} plan shards over all {} devices of {dims:?}{}, got {n}",
                        if matches!(plan, ShardPlan::Torus { .. }) {
                            "torus"
                        } else {
                            "multislice"
                        },
                        shape.device_count(),
                        match plan {
                            ShardPlan::Multislice { slices, .. } => format!(" x {slices} slices"),
                            _ => String::new(),
                        }
                    ),
                });
            }
            if matches!(plan, ShardPlan::Multislice { .. }) && dims.len() != 3 {
                return Err(ShardingError::Devices {
                    reason: format!(
                        "a multislice plan's slice has 3 dimensions (padded with 1s), got {dims:?}"
                    ),
                });
            }
            Ok(torus_shard_ranges(&shape, n)
                .into_iter()
                .map(|r| r.start)
                .collect())
        }
        ShardPlan::Ring { ring } => {
            let mut sorted = ring.clone();
            sorted.sort();
            if sorted != participants {
                return Err(ShardingError::Devices {
                    reason: format!(
                        "the ring {ring:?} is not an ordering of the participants {participants:?}"
                    ),
                });
            }
            // `ring` is a permutation of the sorted participants.
            let mut positions = vec![0; n];
            for (at, d) in ring.iter().enumerate() {
                if let Ok(r) = participants.binary_search(d) {
                    positions[r] = at;
                }
            }
            Ok(positions)
        }
    }
}
