//! Errors from loading and validating pod files.

use thiserror::Error;

/// A pod file that could not be read, parsed or accepted.
///
/// Every variant names where the problem is: the file (or `<string>`), the
/// line and column for syntax errors, and the field or element for semantic
/// ones.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The file could not be read: missing, not a regular file (a named
    /// pipe, a device, a directory), larger than a pod file may be, or
    /// unreadable. The message names the file.
    #[error("cannot read pod file {0}")]
    Read(crate::files::InputError),
    /// The text is not a well-formed pod file.
    #[error("{origin}:{line}:{column}: in `{field}`: {message}")]
    Syntax {
        /// The file name, or `<string>`.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field being read (`extra_links[1].a`), or `Pod` at top level.
        field: String,
        /// What the parser expected.
        message: String,
    },
    /// The file parses but describes a pod that cannot exist.
    #[error("{origin}{}: `{field}`: {problem}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// The file name, or `<string>`.
        origin: String,
        /// The line the field is on, when it could be found.
        line: Option<usize>,
        /// The offending field or element (`shape`, `extra_links[2]`).
        field: String,
        /// What is wrong.
        problem: Box<Problem>,
    },
    /// No preset has this name and no such file exists.
    #[error(
        "no pod preset or file named `{name}`{}; presets: {known}",
        near.as_ref().map(|n| format!("; did you mean `{n}`?")).unwrap_or_default()
    )]
    UnknownPod {
        /// What was asked for.
        name: String,
        /// The preset names, comma-separated.
        known: String,
        /// The preset nearest to `name`, when one is near enough to be
        /// what was meant.
        near: Option<String>,
    },
    /// A name of a Cloud family's form (`v5p-1000`) that is no Cloud
    /// accelerator type.
    #[error(
        "`{name}` is not a Cloud TPU accelerator type: {hint}; did you mean `{near}`? \
         (`optirs-tpu presets` lists them)"
    )]
    NotCloudType {
        /// What was asked for.
        name: String,
        /// What the family's names count and the size nearest.
        hint: String,
        /// The Cloud name to use.
        near: String,
    },
}

/// What is semantically wrong with a pod file.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum Problem {
    /// The pod's name is empty or only whitespace.
    #[error("the pod needs a name (reports, figures and checkpoints show it)")]
    EmptyName,
    /// The generation is not one the engine knows.
    #[error(
        "unknown TPU generation `{0}` (known: {known}){near}",
        near = crate::error::did_you_mean(.0, crate::hardware::TpuGeneration::ALL.map(crate::hardware::TpuGeneration::name)),
        known = crate::hardware::TpuGeneration::names()
    )]
    UnknownGeneration(String),
    /// A shape string that is not `AxB` or `AxBxC` of positive integers.
    #[error("`{text}` is not a shape like `4x4` or `4x4x4`: {reason}")]
    MalformedShape {
        /// The text as written.
        text: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A dimension of size zero.
    #[error("dimension {axis} of `{text}` is zero; every dimension needs at least one chip")]
    ZeroDimension {
        /// The shape as written.
        text: String,
        /// 0-based axis.
        axis: usize,
    },
    /// Wrong number of dimensions for the generation's torus.
    #[error("{generation} chips form a {expected}D torus, but `{text}` has {got} dimensions")]
    WrongDimensionCount {
        /// The generation.
        generation: String,
        /// Its torus dimensions.
        expected: usize,
        /// The shape's dimensions.
        got: usize,
        /// The shape as written.
        text: String,
    },
    /// A list with one entry per dimension has the wrong length.
    #[error("has {got} entries but the shape has {expected} dimensions")]
    WrongLength {
        /// Dimensions in the shape.
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// The host block does not tile the slice.
    #[error(
        "a host drives {bound} chips along dimension {axis}, which does not divide the slice's {size}; \
         chips per host must divide the slice"
    )]
    HostBlockDoesNotDivide {
        /// 0-based axis.
        axis: usize,
        /// Chips per host along the axis.
        bound: u32,
        /// Chips in the slice along the axis.
        size: u32,
    },
    /// Wraparound requested where the generation cannot close a ring.
    #[error("{generation} cannot wrap dimension {axis} of {size} chips around: {rule}")]
    WraparoundNotAllowed {
        /// The generation.
        generation: String,
        /// 0-based axis.
        axis: usize,
        /// Chips along it.
        size: u32,
        /// The rule it breaks.
        rule: String,
    },
    /// A slice shape the generation is not offered in, without `custom: true`.
    #[error(
        "{generation} slices are not offered in shape `{shape}` (offered: {offered}); \
         set `custom: true` to load it anyway"
    )]
    ShapeNotOffered {
        /// The generation.
        generation: String,
        /// The shape as written.
        shape: String,
        /// The offered shapes.
        offered: String,
    },
    /// A `twist` value that is not one of the known ones.
    #[error("unknown twist `{given}` (known: \"none\", \"twisted\")")]
    UnknownTwist {
        /// The value as written.
        given: String,
    },
    /// A cube-built pod (`cubes`) that cannot be built: a generation without
    /// optical circuit switches, a slice not made of whole cubes, more cubes
    /// than the pod has.
    #[error("{reason}")]
    Cubes {
        /// Why, with what would fit.
        reason: String,
    },
    /// A DCN fabric asked for, or configured, where there is none, or one
    /// too large to spawn.
    #[error("{reason}")]
    NoFabric {
        /// Why.
        reason: String,
    },
    /// A twist on a generation or shape that cannot be twisted.
    #[error("a {generation} slice of shape `{shape}` cannot be twisted: {reason}")]
    TwistNotAllowed {
        /// The generation.
        generation: String,
        /// The shape as written.
        shape: String,
        /// Why.
        reason: String,
    },
    /// More chips than the engine models.
    #[error("{chips} chips is more than the {max} a pod may have")]
    TooManyChips {
        /// Requested.
        chips: u64,
        /// The cap.
        max: u64,
    },
    /// A number that must be positive and finite is not.
    #[error("{value} is not valid here: must be {requirement}")]
    BadNumber {
        /// The value as given.
        value: String,
        /// What it must be.
        requirement: &'static str,
    },
    /// An explicit link names a device the pod does not have.
    #[error("device {device} does not exist (the pod has devices 0 to {last})", last = devices.saturating_sub(1))]
    UnknownDevice {
        /// The id given.
        device: u32,
        /// Number of devices.
        devices: u32,
    },
    /// An explicit link from a device to itself.
    #[error("links device {device} to itself")]
    SelfLink {
        /// The device.
        device: u32,
    },
    /// An explicit link that already exists (explicitly or in the torus).
    #[error("duplicates the {kind} link between devices {a} and {b} ({previous})")]
    DuplicateLink {
        /// One end.
        a: u32,
        /// Other end.
        b: u32,
        /// `ICI` or `DCN`.
        kind: &'static str,
        /// Where the first one came from.
        previous: String,
    },
    /// Some devices cannot reach others.
    #[error(
        "the pod is disconnected: device {unreachable} cannot be reached from device 0 \
         ({count} devices unreachable); join slices with the DCN fabric (`dcn: (fabric: true)`, \
         the default for 2 or more slices) or `extra_links` of kind Dcn"
    )]
    Disconnected {
        /// The first unreachable device.
        unreachable: u32,
        /// How many devices are unreachable.
        count: u32,
    },
    /// The heartbeat timeout does not exceed the interval.
    #[error(
        "heartbeat timeout ({timeout_ms} ms) must be longer than the interval ({interval_ms} ms)"
    )]
    TimeoutNotAfterInterval {
        /// Interval.
        interval_ms: f64,
        /// Timeout.
        timeout_ms: f64,
    },
    /// The heartbeat interval is shorter than a tick: a device would owe
    /// several heartbeats per tick.
    #[error(
        "heartbeat interval ({interval_ms} ms) is shorter than the tick ({tick_ms} ms); \
         a device sends at most one heartbeat per tick, so the interval must be at least one tick"
    )]
    IntervalShorterThanTick {
        /// Interval.
        interval_ms: f64,
        /// Tick.
        tick_ms: f64,
    },
    /// A heartbeat sent just after the last one arrived could arrive after
    /// the timeout: healthy devices would be declared failed.
    #[error(
        "control latency ({latency_ms} ms) plus the heartbeat interval ({interval_ms} ms) \
         exceeds the heartbeat timeout ({timeout_ms} ms); a running device is only safe from \
         false failure while latency + jitter + interval <= timeout"
    )]
    ControlLatencyExceedsTimeout {
        /// One-way latency of the control network (the DCN latency).
        latency_ms: f64,
        /// Interval.
        interval_ms: f64,
        /// Timeout.
        timeout_ms: f64,
    },
}

impl From<TopologyError> for crate::error::OptimError {
    fn from(error: TopologyError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Topology, error)
    }
}

/// A broken invariant of a [`Topology`](super::Topology) that did not come
/// through validation (one decoded from a snapshot): what
/// [`Topology::check_invariants`](super::Topology::check_invariants) found,
/// naming the field.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum InvariantError {
    /// The dimension count is not the generation's.
    #[error("ndims = {ndims}, but a {generation} torus has {torus_dims} dimensions")]
    DimensionCount {
        /// Dimensions recorded.
        ndims: usize,
        /// The chip generation.
        generation: crate::hardware::TpuGeneration,
        /// The generation's torus dimensions.
        torus_dims: usize,
    },
    /// An axis has no chips, or an unused axis more than one.
    #[error("dims[{axis}] = {size} is not a chip count of the shape")]
    Dimension {
        /// The axis.
        axis: usize,
        /// Its recorded size.
        size: u32,
    },
    /// No slices.
    #[error("slices = 0")]
    NoSlices,
    /// More chips than a pod may have.
    #[error("{chips} chips, more than {max}")]
    TooManyChips {
        /// Chips recorded.
        chips: u64,
        /// The bound.
        max: u64,
    },
    /// The host block does not divide the slice along an axis.
    #[error("host_bounds[{axis}] = {bound} does not divide dims[{axis}] = {size}")]
    HostBlock {
        /// The axis.
        axis: usize,
        /// The host block's extent along it.
        bound: u32,
        /// The slice's.
        size: u32,
    },
    /// Cores per chip out of range.
    #[error("cores_per_chip = {0} is not between 1 and 8")]
    Cores(u32),
    /// A zero tick or heartbeat interval.
    #[error("tick_ns and heartbeat_interval_ns must be at least 1")]
    ZeroTime,
    /// The heartbeat timeout is not after the interval.
    #[error("heartbeat_timeout_ns is not after heartbeat_interval_ns")]
    TimeoutNotAfterInterval,
    /// A twist offset that is not a shift along another axis.
    #[error(
        "twist[{axis}][{other}] = {offset} is not a shift along another axis \
         of the shape"
    )]
    TwistOffset {
        /// The axis whose wraparound link moves.
        axis: usize,
        /// The axis it moves along.
        other: usize,
        /// By how many chips.
        offset: u32,
    },
    /// A twist on an axis without a wraparound link.
    #[error("twist[{0}] moves a wraparound link that axis {0} does not have")]
    TwistWithoutWraparound(usize),
    /// A fabric over one slice, or with figures out of range.
    #[error(
        "dcn_fabric {0:?} needs 2 or more slices, positive host bandwidth \
         and an oversubscription of at least 1"
    )]
    FabricFigures(super::resolve::DcnFabric),
    /// More fabric links than a pod may have.
    #[error("the DCN fabric has {links} links, more than {max}")]
    TooManyFabricLinks {
        /// Links the fabric would spawn.
        links: u64,
        /// The bound.
        max: u64,
    },
    /// The cube layout does not fit the slices.
    #[error("cubes {layout:?} do not fit slices of {dims:?} x {slices}")]
    CubesDoNotFit {
        /// The layout recorded.
        layout: super::cubes::CubeLayout,
        /// One slice's dimensions.
        dims: [u32; 3],
        /// Slices.
        slices: u32,
    },
    /// An explicit link with an end outside the pod.
    #[error("extra link {a} -> {b} leaves the pod's {devices} devices")]
    ExtraLinkOutside {
        /// One end.
        a: u32,
        /// Other end.
        b: u32,
        /// Devices in the pod.
        devices: u32,
    },
}
