//! Every component type and resource the engine persists, in one list.
//!
//! A domain that adds a component type adds it here; the coverage test
//! (`tests/checkpoint.rs`) fails for any `optirs_tpu` component or resource
//! that is neither registered nor listed in [`NOT_PERSISTED`] with a reason.

use crate::barrier::{Barrier, BarrierArrivals, BarrierOutcome, BarrierRegistry, PendingBarrier};
use crate::clock::SimClock;
use crate::clock_sync::systems::{ClockSync, DeviceClock};
use crate::collectives::pod::{Collective, CollectiveOutcome};
use crate::compiler::graph::{
    DeclaredType, InProgram, Literal, Node, NodeName, Operands, Output, PendingCompile, Program,
    ProgramNodes, ProgramOutputs, ValueType,
};
use crate::compiler::passes::cost_analysis::{KernelCost, NodeCost, ProgramCost};
use crate::compiler::passes::fusion::{FusionRefusals, InKernel, Kernel, ProgramKernels};
use crate::compiler::passes::lower::CompiledExecutable;
use crate::compiler::passes::memory_plan::{Buffer, MemoryPlan};
use crate::compiler::passes::ordering::KernelPosition;
use crate::compiler::passes::{CompileFailure, DisabledPasses, PassLog};
use crate::health::Excluded;
use crate::health::{
    ControlJitter, DeviceState, FailureEpoch, FailureLog, FaultPlan, Health, Heartbeat,
    HeartbeatConfig, InjectedFault, KnownFailures, LastHeard,
};
use crate::memory::HbmUsage;
use crate::memory::{OptimizerCount, OptimizerSlot, ReplicaParams, ShardSlot};
use crate::monitor::{
    DeviceHistory, DeviceMetrics, HealthChecks, HealthThresholds, HeartbeatTally, LinkMetrics,
    MonitorConfig, MonitorState,
};
use crate::persist::SnapshotError;
use crate::persist::SnapshotRegistry;
use crate::persist::persist_as_self;
use crate::persist::{LoadContext, Persist, StoreContext};
use crate::rng::SimRng;
use crate::sharding::ShardedModel;
use crate::topology::{
    Cube, Device, DeviceIndex, HbmCapacity, Host, InCube, Link, LinkKind, LinkTraffic, Ocs,
    OcsCircuit, OnHost, PodTopology, TorusCoords,
};
use crate::transport::{DeliveryLog, Inbox, LinkQueue, LinkState, Transport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Engine types deliberately left out of snapshots, with the reason.
pub const NOT_PERSISTED: &[(&str, &str)] = &[
    (
        "HostDevices",
        "bevy rebuilds it from `OnHost` when the devices are restored",
    ),
    ("SnapshotRegistry", "code, not state: the codecs themselves"),
    (
        "VerifyGraph",
        "a debugging switch of the build (on in debug builds): persisting it would make the \
         world's bytes depend on the build profile; it never changes what a compile produces",
    ),
    (
        "DeviceHeap",
        "rebuilt after a restore on every device with an `HbmUsage` (persisted), from \
         `HbmCapacity` and the resident `OptimizerSlot`s; `HbmUsage` is set from it",
    ),
    (
        "ResidentBlock",
        "a slot's offset in a rebuilt heap: reserved again when the heap is rebuilt",
    ),
    (
        "ShardBlock",
        "a shard's offset in a rebuilt heap: reserved again when the heap is rebuilt",
    ),
    (
        "ShardedStep",
        "a step in flight is not state: a checkpoint holds the model as it was before the \
         step, and a restored pod has no step in flight",
    ),
    (
        "StartingModel",
        "the run's initial model, kept in memory by the host for a rollback before the first \
         checkpoint; a checkpoint holds the model itself",
    ),
    (
        "ExactStops",
        "the clock's exact-stop sources are code that reads the world, and the host's target \
         lasts one call",
    ),
    (
        "PeriodicCheckpoints",
        "host configuration: a restored pod keeps the host's current checkpoint settings",
    ),
    (
        "Network",
        "the machinery that moves messages between processes, not state: a restored pod \
         keeps the host's backend (its in-flight messages are in `Transport`)",
    ),
];

persist_as_self!(
    Device,
    TorusCoords,
    Cube,
    Ocs,
    InCube,
    OcsCircuit,
    HbmCapacity,
    Host,
    LinkTraffic,
    LinkState,
    LinkQueue,
    DeviceState,
    Health,
    Heartbeat,
    LastHeard,
    ControlJitter,
    KnownFailures,
    InjectedFault,
    Barrier,
    BarrierArrivals,
    BarrierOutcome,
    PendingBarrier,
    Excluded,
    Collective,
    CollectiveOutcome,
    DeviceClock,
    ClockSync,
    SimClock,
    SimRng,
    HeartbeatConfig,
    FailureEpoch,
    FailureLog,
    FaultPlan,
    HbmUsage,
    HeartbeatTally,
    DeviceMetrics,
    LinkMetrics,
    HealthChecks,
    MonitorConfig,
    MonitorState,
    HealthThresholds,
);

/// A type stored as itself whose invariants are checked before a restore:
/// the digest of a forged file matches, so decoding must validate what the
/// loaders validate for files people write.
macro_rules! persist_as_self_checked {
    ($($ty:ty => $name:literal),* $(,)?) => {$(
        impl Persist for $ty {
            type Stored = $ty;
            fn store(&self, _: &StoreContext) -> Result<$ty, SnapshotError> {
                Ok(self.clone())
            }
            fn load(stored: $ty, ctx: &LoadContext) -> Result<$ty, SnapshotError> {
                Self::check(&stored, ctx)?;
                Ok(stored)
            }
            fn check(stored: &$ty, _: &LoadContext) -> Result<(), SnapshotError> {
                invariants(stored).map_err(|source| SnapshotError::Invalid {
                    column: $name.to_string(),
                    source,
                })
            }
        }
    )*};
}

/// The invariant a stored value breaks, as its domain reports it.
type BrokenInvariant = Box<dyn std::error::Error + Send + Sync>;

trait Invariants {
    fn invariants(&self) -> Result<(), BrokenInvariant>;
}

fn invariants<T: Invariants>(value: &T) -> Result<(), BrokenInvariant> {
    value.invariants()
}

impl Invariants for PodTopology {
    fn invariants(&self) -> Result<(), BrokenInvariant> {
        Ok(self.0.check_invariants()?)
    }
}

impl Invariants for DeviceHistory {
    fn invariants(&self) -> Result<(), BrokenInvariant> {
        Ok(self.check_invariants()?)
    }
}

persist_as_self_checked!(
    PodTopology => "topology.PodTopology",
    DeviceHistory => "monitor.DeviceHistory",
);

/// [`Link`] with its ends as dense ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredLink {
    a: u32,
    b: u32,
    kind: LinkKind,
    axis: Option<u8>,
    wraps: bool,
    bytes_per_s: f64,
    latency_ns: u64,
}

impl Persist for Link {
    type Stored = StoredLink;

    fn store(&self, ctx: &StoreContext) -> Result<StoredLink, SnapshotError> {
        Ok(StoredLink {
            a: ctx.dense(self.a, "Link.a")?,
            b: ctx.dense(self.b, "Link.b")?,
            kind: self.kind,
            axis: self.axis,
            wraps: self.wraps,
            bytes_per_s: self.bytes_per_s,
            latency_ns: self.latency_ns,
        })
    }

    fn load(s: StoredLink, ctx: &LoadContext) -> Result<Link, SnapshotError> {
        Ok(Link {
            a: ctx.entity(s.a, "Link.a")?,
            b: ctx.entity(s.b, "Link.b")?,
            kind: s.kind,
            axis: s.axis,
            wraps: s.wraps,
            bytes_per_s: s.bytes_per_s,
            latency_ns: s.latency_ns,
        })
    }
}

impl Persist for OnHost {
    type Stored = u32;

    fn store(&self, ctx: &StoreContext) -> Result<u32, SnapshotError> {
        ctx.dense(self.0, "OnHost")
    }

    fn load(dense: u32, ctx: &LoadContext) -> Result<OnHost, SnapshotError> {
        Ok(OnHost(ctx.entity(dense, "OnHost")?))
    }
}

impl Persist for DeviceIndex {
    type Stored = Vec<u32>;

    fn store(&self, ctx: &StoreContext) -> Result<Vec<u32>, SnapshotError> {
        self.0
            .iter()
            .map(|&e| ctx.dense(e, "DeviceIndex"))
            .collect()
    }

    fn load(stored: Vec<u32>, ctx: &LoadContext) -> Result<DeviceIndex, SnapshotError> {
        Ok(DeviceIndex(
            stored
                .into_iter()
                .map(|d| ctx.entity(d, "DeviceIndex"))
                .collect::<Result<_, _>>()?,
        ))
    }
}

impl Persist for BarrierRegistry {
    type Stored = (Vec<u32>, BTreeMap<String, u64>);

    fn store(&self, ctx: &StoreContext) -> Result<Self::Stored, SnapshotError> {
        let ids = self
            .by_id
            .iter()
            .map(|&e| ctx.dense(e, "BarrierRegistry"))
            .collect::<Result<_, _>>()?;
        Ok((ids, self.by_name.clone()))
    }

    fn load((ids, by_name): Self::Stored, ctx: &LoadContext) -> Result<Self, SnapshotError> {
        Ok(BarrierRegistry {
            by_id: ids
                .into_iter()
                .map(|d| ctx.entity(d, "BarrierRegistry"))
                .collect::<Result<_, _>>()?,
            by_name,
        })
    }
}

/// The engine's registry: every component type and resource it persists.
pub fn engine_registry() -> SnapshotRegistry {
    let mut registry = SnapshotRegistry::default();
    registry
        .component::<Device>("topology.Device")
        .component::<TorusCoords>("topology.TorusCoords")
        .component::<Cube>("topology.Cube")
        .component::<Ocs>("topology.Ocs")
        .component::<InCube>("topology.InCube")
        .component::<OcsCircuit>("topology.OcsCircuit")
        .component::<HbmCapacity>("topology.HbmCapacity")
        .component::<OnHost>("topology.OnHost")
        .component::<Host>("topology.Host")
        .component::<Link>("topology.Link")
        .component::<LinkTraffic>("topology.LinkTraffic")
        .component::<LinkState>("transport.LinkState")
        .component::<LinkQueue>("transport.LinkQueue")
        .component::<DeviceState>("health.DeviceState")
        .component::<Health>("health.Health")
        .component::<Heartbeat>("health.Heartbeat")
        .component::<LastHeard>("health.LastHeard")
        .component::<ControlJitter>("health.ControlJitter")
        .component::<KnownFailures>("health.KnownFailures")
        .component::<InjectedFault>("health.InjectedFault")
        .component::<Barrier>("barrier.Barrier")
        .component::<BarrierArrivals>("barrier.BarrierArrivals")
        .component::<BarrierOutcome>("barrier.BarrierOutcome")
        .component::<PendingBarrier>("barrier.PendingBarrier")
        .component::<Excluded>("fault_tolerance.Excluded")
        .component::<Collective>("collectives.Collective")
        .component::<CollectiveOutcome>("collectives.CollectiveOutcome")
        .component::<DeviceClock>("clocks.DeviceClock")
        .component::<ClockSync>("clocks.ClockSync")
        .component::<Program>("xla.Program")
        .component::<ProgramNodes>("xla.ProgramNodes")
        .component::<ProgramOutputs>("xla.ProgramOutputs")
        .component::<PendingCompile>("xla.PendingCompile")
        .component::<InProgram>("xla.InProgram")
        .component::<Node>("xla.Node")
        .component::<Operands>("xla.Operands")
        .component::<NodeName>("xla.NodeName")
        .component::<DeclaredType>("xla.DeclaredType")
        .component::<ValueType>("xla.ValueType")
        .component::<Literal>("xla.Literal")
        .component::<Output>("xla.Output")
        .component::<Kernel>("xla.Kernel")
        .component::<InKernel>("xla.InKernel")
        .component::<ProgramKernels>("xla.ProgramKernels")
        .component::<FusionRefusals>("xla.FusionRefusals")
        .component::<KernelPosition>("xla.KernelPosition")
        .component::<NodeCost>("xla.NodeCost")
        .component::<KernelCost>("xla.KernelCost")
        .component::<ProgramCost>("xla.ProgramCost")
        .component::<Buffer>("xla.Buffer")
        .component::<MemoryPlan>("xla.MemoryPlan")
        .component::<PassLog>("xla.PassLog")
        .component::<CompileFailure>("xla.CompileFailure")
        .component::<CompiledExecutable>("xla.CompiledExecutable")
        .component::<OptimizerSlot>("tpu.OptimizerSlot")
        .component::<OptimizerCount>("tpu.OptimizerCount")
        .component::<ShardSlot>("sharding.ShardSlot")
        .component::<ReplicaParams>("sharding.ReplicaParams")
        .component::<ShardedModel>("sharding.ShardedModel")
        .component::<HbmUsage>("monitor.HbmUsage")
        .component::<HeartbeatTally>("monitor.HeartbeatTally")
        .component::<DeviceMetrics>("monitor.DeviceMetrics")
        .component::<LinkMetrics>("monitor.LinkMetrics")
        .component::<HealthChecks>("monitor.HealthChecks");
    registry
        .resource::<SimClock>("pod.SimClock")
        .resource::<SimRng>("pod.SimRng")
        .resource::<PodTopology>("topology.PodTopology")
        .resource::<DeviceIndex>("topology.DeviceIndex")
        .resource::<Transport>("transport.Transport")
        .resource::<Inbox>("transport.Inbox")
        .resource::<DeliveryLog>("transport.DeliveryLog")
        .resource::<HeartbeatConfig>("health.HeartbeatConfig")
        .resource::<FailureEpoch>("health.FailureEpoch")
        .resource::<FailureLog>("health.FailureLog")
        .resource::<FaultPlan>("health.FaultPlan")
        .resource::<BarrierRegistry>("barrier.BarrierRegistry")
        .resource::<DisabledPasses>("xla.DisabledPasses")
        .resource::<MonitorConfig>("monitor.MonitorConfig")
        .resource::<MonitorState>("monitor.MonitorState")
        .resource::<HealthThresholds>("monitor.HealthThresholds")
        .resource::<DeviceHistory>("monitor.DeviceHistory");
    registry
}
