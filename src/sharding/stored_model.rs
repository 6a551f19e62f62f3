//! How a [`ShardedModel`] is stored in a snapshot: a positional tuple
//! whose fields after the twelfth are written only when they differ from
//! their defaults, so snapshots taken before strategies and meshes load and
//! a replicated model on the pod's default mesh is written byte for byte as
//! it always was.

use serde::{Deserialize, Serialize};

use super::layout::ShardLayout;
use super::mesh::{Mesh, Strategy};
use super::model::{RecoveryPolicy, RecoveryRecord, Reduction, ShardedModel};
use super::residency::DEFAULT_PREFETCH;
use crate::persist::{LoadContext, Persist, SnapshotError, StoreContext, StoredTensorValue};

/// [`ShardedModel`] as stored: its parameters in the tensor file. Encoded
/// as a tuple (the snapshot codec is postcard's, positional): a replicated
/// model with the default prefetch on the default mesh ends after
/// `recovering_until_ns`, as every snapshot taken before strategies does,
/// so those load (as replicated) and a replicated world's bytes and digest
/// are what they were; any other strategy or prefetch appends `strategy`
/// and `prefetch`, and a mesh other than the pod's default appends `mesh`
/// after them.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredShardedModel {
    optimizer: String,
    slots: Vec<String>,
    layout: ShardLayout,
    params: StoredTensorValue,
    count: i32,
    steps_completed: u64,
    steps_failed: u64,
    reduction: Reduction,
    bucket_bytes: usize,
    recovery: RecoveryPolicy,
    recoveries: Vec<RecoveryRecord>,
    recovering_until_ns: u64,
    strategy: Strategy,
    prefetch: usize,
    mesh: Option<Mesh>,
}

/// Fields of a [`StoredShardedModel`] before strategies.
const STORED_MODEL_FIELDS: usize = 12;

impl Serialize for StoredShardedModel {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let meshed = self.mesh.is_some();
        let extended =
            meshed || self.strategy != Strategy::Replicated || self.prefetch != DEFAULT_PREFETCH;
        let len = STORED_MODEL_FIELDS + usize::from(extended) * 2 + usize::from(meshed);
        let mut t = serializer.serialize_tuple(len)?;
        t.serialize_element(&self.optimizer)?;
        t.serialize_element(&self.slots)?;
        t.serialize_element(&self.layout)?;
        t.serialize_element(&self.params)?;
        t.serialize_element(&self.count)?;
        t.serialize_element(&self.steps_completed)?;
        t.serialize_element(&self.steps_failed)?;
        t.serialize_element(&self.reduction)?;
        t.serialize_element(&self.bucket_bytes)?;
        t.serialize_element(&self.recovery)?;
        t.serialize_element(&self.recoveries)?;
        t.serialize_element(&self.recovering_until_ns)?;
        if extended {
            t.serialize_element(&self.strategy)?;
            t.serialize_element(&self.prefetch)?;
        }
        if meshed {
            t.serialize_element(&self.mesh)?;
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for StoredShardedModel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = StoredShardedModel;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a stored sharded model")
            }
            fn visit_seq<S: serde::de::SeqAccess<'de>>(
                self,
                mut seq: S,
            ) -> Result<StoredShardedModel, S::Error> {
                let optimizer = field(&mut seq, 0)?;
                let slots = field(&mut seq, 1)?;
                let layout = field(&mut seq, 2)?;
                let params = field(&mut seq, 3)?;
                let count = field(&mut seq, 4)?;
                let steps_completed = field(&mut seq, 5)?;
                let steps_failed = field(&mut seq, 6)?;
                let reduction = field(&mut seq, 7)?;
                let bucket_bytes = field(&mut seq, 8)?;
                let recovery = field(&mut seq, 9)?;
                let recoveries = field(&mut seq, 10)?;
                let recovering_until_ns = field(&mut seq, 11)?;
                // A model stored before strategies (or a replicated one)
                // ends here: the input ends, or the sequence does.
                let (strategy, prefetch) = match seq.next_element::<Strategy>() {
                    Ok(Some(strategy)) => {
                        (strategy, seq.next_element()?.unwrap_or(DEFAULT_PREFETCH))
                    }
                    Ok(None) => (Strategy::Replicated, DEFAULT_PREFETCH),
                    Err(e) if is_end_of_input(&e) => (Strategy::Replicated, DEFAULT_PREFETCH),
                    Err(e) => return Err(e),
                };
                // A model on the pod's default mesh ends here.
                let mesh = match seq.next_element::<Option<Mesh>>() {
                    Ok(mesh) => mesh.flatten(),
                    Err(e) if is_end_of_input(&e) => None,
                    Err(e) => return Err(e),
                };
                Ok(StoredShardedModel {
                    optimizer,
                    slots,
                    layout,
                    params,
                    count,
                    steps_completed,
                    steps_failed,
                    reduction,
                    bucket_bytes,
                    recovery,
                    recoveries,
                    recovering_until_ns,
                    strategy,
                    prefetch,
                    mesh,
                })
            }
        }
        deserializer.deserialize_tuple(STORED_MODEL_FIELDS + 3, Fields)
    }
}

/// Field `k` of a stored model, which every stored model has.
fn field<'de, T: Deserialize<'de>, S: serde::de::SeqAccess<'de>>(
    seq: &mut S,
    k: usize,
) -> Result<T, S::Error> {
    seq.next_element()?
        .ok_or_else(|| serde::de::Error::invalid_length(k, &"a stored sharded model's 12 fields"))
}

/// Whether a decoding error is postcard's end of input (the one model row
/// is the last thing in its column, so a short model ends the input).
fn is_end_of_input(e: &impl std::fmt::Display) -> bool {
    e.to_string() == postcard::Error::DeserializeUnexpectedEnd.to_string()
}

impl StoredShardedModel {
    /// The stored layout.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// The stored strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The stored fsdp prefetch.
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The stored mesh (`None`: the pod's default).
    pub fn mesh(&self) -> Option<&Mesh> {
        self.mesh.as_ref()
    }
}

impl Persist for ShardedModel {
    type Stored = StoredShardedModel;

    fn store(&self, ctx: &StoreContext) -> Result<StoredShardedModel, SnapshotError> {
        Ok(StoredShardedModel {
            optimizer: self.optimizer.clone(),
            slots: self.slots.clone(),
            layout: self.layout.clone(),
            params: crate::persist::store_tensor(&self.params, ctx)?,
            count: self.count,
            steps_completed: self.steps_completed,
            steps_failed: self.steps_failed,
            reduction: self.reduction,
            bucket_bytes: self.bucket_bytes,
            recovery: self.recovery,
            recoveries: self.recoveries.clone(),
            recovering_until_ns: self.recovering_until_ns,
            strategy: self.strategy,
            prefetch: self.prefetch,
            mesh: self.mesh.clone(),
        })
    }

    fn load(s: StoredShardedModel, ctx: &LoadContext) -> Result<ShardedModel, SnapshotError> {
        Ok(ShardedModel {
            optimizer: s.optimizer,
            slots: s.slots,
            layout: s.layout,
            params: crate::persist::load_tensor(s.params, ctx, "ShardedModel")?,
            count: s.count,
            steps_completed: s.steps_completed,
            steps_failed: s.steps_failed,
            reduction: s.reduction,
            bucket_bytes: s.bucket_bytes,
            recovery: s.recovery,
            recoveries: s.recoveries,
            recovering_until_ns: s.recovering_until_ns,
            strategy: s.strategy,
            prefetch: s.prefetch,
            mesh: s.mesh,
        })
    }

    fn check(s: &StoredShardedModel, ctx: &LoadContext) -> Result<(), SnapshotError> {
        crate::persist::check_tensor(&s.params, ctx, "ShardedModel")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;
    use crate::sharding::model::flat_tensor;
    use crate::topology::DeviceId;

    /// The stored model as it was before strategies (the derive's field
    /// order is the encoding).
    #[derive(Serialize)]
    struct Before {
        optimizer: String,
        slots: Vec<String>,
        layout: ShardLayout,
        params: StoredTensorValue,
        count: i32,
        steps_completed: u64,
        steps_failed: u64,
        reduction: Reduction,
        bucket_bytes: usize,
        recovery: RecoveryPolicy,
        recoveries: Vec<RecoveryRecord>,
        recovering_until_ns: u64,
    }

    fn stored(strategy: Strategy, prefetch: usize) -> StoredShardedModel {
        stored_on(strategy, prefetch, None)
    }

    fn stored_on(strategy: Strategy, prefetch: usize, mesh: Option<Mesh>) -> StoredShardedModel {
        let layout = ShardLayout::new(
            DType::F32,
            &[("w".to_string(), vec![5])],
            64,
            vec![DeviceId(0), DeviceId(1)],
            crate::sharding::ShardPlan::Ring {
                ring: vec![DeviceId(0), DeviceId(1)],
            },
        )
        .unwrap();
        StoredShardedModel {
            optimizer: "adam".into(),
            slots: vec!["mu".into(), "nu".into()],
            layout,
            params: StoredTensorValue::Inline(flat_tensor(vec![0.5f32; 6])),
            count: 3,
            steps_completed: 3,
            steps_failed: 1,
            reduction: Reduction::Mean,
            bucket_bytes: 64,
            recovery: RecoveryPolicy::Redundant,
            recoveries: Vec::new(),
            recovering_until_ns: 7,
            strategy,
            prefetch,
            mesh,
        }
    }

    fn before(s: &StoredShardedModel) -> Before {
        Before {
            optimizer: s.optimizer.clone(),
            slots: s.slots.clone(),
            layout: s.layout.clone(),
            params: s.params.clone(),
            count: s.count,
            steps_completed: s.steps_completed,
            steps_failed: s.steps_failed,
            reduction: s.reduction,
            bucket_bytes: s.bucket_bytes,
            recovery: s.recovery,
            recoveries: s.recoveries.clone(),
            recovering_until_ns: s.recovering_until_ns,
        }
    }

    #[test]
    fn a_model_stored_before_strategies_loads_as_replicated() {
        let model = stored(Strategy::Replicated, DEFAULT_PREFETCH);
        let old = postcard::to_stdvec(&vec![(0u32, before(&model))]).unwrap();
        // A replicated model is written as before, byte for byte.
        assert_eq!(
            postcard::to_stdvec(&vec![(0u32, model.clone())]).unwrap(),
            old
        );
        let rows: Vec<(u32, StoredShardedModel)> = postcard::from_bytes(&old).unwrap();
        assert_eq!(rows, vec![(0, model)]);
        // A truncated old field is still an error, not a default.
        assert!(
            postcard::from_bytes::<Vec<(u32, StoredShardedModel)>>(&old[..old.len() - 1]).is_err()
        );
    }

    #[test]
    fn every_strategy_round_trips() {
        for strategy in Strategy::ALL {
            for prefetch in [0, 1, 4] {
                let model = stored(strategy, prefetch);
                let bytes = postcard::to_stdvec(&vec![(0u32, model.clone())]).unwrap();
                let rows: Vec<(u32, StoredShardedModel)> = postcard::from_bytes(&bytes).unwrap();
                assert_eq!(rows, vec![(0, model)], "{strategy} {prefetch}");
            }
        }
    }

    #[test]
    fn a_mesh_round_trips_after_every_strategy() {
        let topology = crate::topology::parse_topology(
            "Pod(name: \"v4-16\", generation: \"v4\", shape: \"2x2x4\")",
            "v4-16.ron",
        )
        .unwrap();
        let mesh = Mesh::parse("data=2,fsdp=8", &topology).unwrap();
        for strategy in Strategy::ALL {
            for prefetch in [0, 1] {
                let model = stored_on(strategy, prefetch, Some(mesh.clone()));
                let bytes = postcard::to_stdvec(&vec![(0u32, model.clone())]).unwrap();
                let rows: Vec<(u32, StoredShardedModel)> = postcard::from_bytes(&bytes).unwrap();
                assert_eq!(rows, vec![(0, model)], "{strategy} {prefetch}");
            }
        }
        // Without a mesh, nothing is appended.
        let plain = stored(Strategy::Zero2, 1);
        let with = stored_on(Strategy::Zero2, 1, Some(mesh));
        assert!(
            postcard::to_stdvec(&plain).unwrap().len() < postcard::to_stdvec(&with).unwrap().len()
        );
    }
}
