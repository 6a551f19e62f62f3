//! Pod presets: every Google Cloud TPU accelerator type, by Cloud's name.
//!
//! A name means what Cloud sells under it. v2, v3, v4, v5p and TPU7x names
//! count **TensorCores**, two a chip: `v4-8` is 4 chips (2x2x1, one host),
//! `v4-16` is 8 chips (2x2x2), `v5p-1024` is 512 chips (8x8x8). v5e
//! (`v5litepod-N`, with `v5e-N` as an alias) and v6e names count **chips**:
//! `v5litepod-16` and `v5e-16` are 16 chips (4x4), `v6e-256` is 256.
//!
//! Sources, one shape per size:
//! - v2 and v3: Cloud TPU "TPU v2" and "TPU v3" pages (cloud.google.com/tpu/docs/v2,
//!   /v3): v2-8 … v2-512 and v3-8 … v3-2048; the shapes are the 2D tori of
//!   [`crate::hardware`]'s `slice_shapes`, 4 chips per host.
//! - v4: "TPU v4" and "TPU types and topologies" (cloud.google.com/tpu/docs/v4,
//!   /types-topologies) and XPK (`AI-Hypercomputer/xpk`,
//!   `src/xpk/core/system_characteristics.py`): v4-8 (2x2x1) … v4-4096
//!   (8x16x16), and v4-8192, the whole 16x16x16 pod.
//! - v5e: "TPU v5e" (cloud.google.com/tpu/docs/v5e): v5litepod-1 (1x1) …
//!   v5litepod-256 (16x16), 8 chips per host.
//! - v5p: "TPU v5p" (cloud.google.com/tpu/docs/v5p: v5p-8 2x2x1 … v5p-12288
//!   16x16x24, 4 chips per host) and XPK's table for every other size, up to
//!   v5p-17920 (16x20x28).
//! - v6e: "TPU v6e" (cloud.google.com/tpu/docs/v6e): v6e-1 (1x1) … v6e-256
//!   (16x16).
//! - TPU7x (Ironwood): XPK's table, tpu7x-2 (one chip) … tpu7x-18432
//!   (16x24x24, the 9216-chip pod).
//!
//! Before Cloud's names, the bundled presets were named by chips; the
//! names whose meaning changed are in [`RENAMED`] (the CLI says so when one
//! is used). A name of a family's form that Cloud does not sell
//! (`v5p-1000`, `v4-4`) is refused with the Cloud name for that many chips.

use std::borrow::Cow;
use std::sync::LazyLock;

/// `(name, RON text)` of the presets bundled as files (`assets/pods/`),
/// smallest generation first: one or two of each generation, the ones the
/// tests and docs use. Every other accelerator type is generated from
/// [`cloud_types`].
pub const PRESETS: &[(&str, &str)] = &[
    ("v2-8", include_str!("../../assets/pods/v2-8.ron")),
    ("v3-64", include_str!("../../assets/pods/v3-64.ron")),
    ("v4-16", include_str!("../../assets/pods/v4-16.ron")),
    ("v4-128", include_str!("../../assets/pods/v4-128.ron")),
    ("v4-8192", include_str!("../../assets/pods/v4-8192.ron")),
    ("v5e-16", include_str!("../../assets/pods/v5e-16.ron")),
    ("v5e-256", include_str!("../../assets/pods/v5e-256.ron")),
    ("v5p-256", include_str!("../../assets/pods/v5p-256.ron")),
    ("v6e-256", include_str!("../../assets/pods/v6e-256.ron")),
    ("tpu7x-512", include_str!("../../assets/pods/tpu7x-512.ron")),
];

/// The pod `optirs-tpu run` uses when none is named.
pub const DEFAULT_PRESET: &str = "v5e-16";

/// The names the bundled presets had when they counted chips and that
/// Cloud uses for another size: `(name, what that pod is called now)`.
pub const RENAMED: &[(&str, &str)] = &[
    ("v2-8", "assets/pods/examples/v2-4x2-custom.ron"),
    ("v3-32", "v3-64"),
    ("v4-8", "v4-16"),
    ("v4-64", "v4-128"),
    ("v4-4096", "v4-8192"),
    ("v5p-128", "v5p-256"),
    ("tpu7x-256", "tpu7x-512"),
];

/// One family of Cloud accelerator types.
struct Family {
    /// The name's prefix (`v5litepod`).
    prefix: &'static str,
    /// Another prefix meaning the same (`v5e`).
    alias: Option<&'static str>,
    /// The generation, as in pod files.
    generation: &'static str,
    /// What the name's number counts per chip: 2 (TensorCores) or 1 (chips).
    per_chip: u32,
    /// Chips per host, as a block of the slice.
    host_block: [u32; 3],
    /// One shape per size, smallest first.
    shapes: &'static [&'static str],
}

const TWO_D: &[&str] = &["1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"];

/// v5p's sizes (\[xpk\] in [`crate::hardware`]; the Cloud page's table for
/// the sizes it lists agrees).
const CUBE_BUILT: &[&str] = &[
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "4x4x20", "4x8x12",
    "4x4x28", "8x8x8", "4x12x12", "4x8x20", "4x4x44", "8x8x12", "4x4x52", "4x8x28", "4x12x20",
    "8x8x16", "4x4x68", "8x12x12", "4x4x76", "8x8x20", "4x12x28", "4x8x44", "4x4x92", "8x12x16",
    "4x20x20", "4x8x52", "12x12x12", "8x8x28", "4x4x116", "8x12x20", "4x4x124", "8x16x16",
    "4x12x44", "4x8x68", "4x20x28", "12x12x16", "4x4x148", "4x8x76", "4x12x52", "8x16x20",
    "4x4x164", "8x12x28", "4x4x172", "8x8x44", "12x12x20", "4x8x92", "4x4x188", "12x16x16",
    "4x28x28", "8x20x20", "4x12x68", "8x8x52", "4x4x212", "12x12x24", "4x20x44", "8x16x28",
    "4x12x76", "4x8x116", "4x4x236", "12x16x20", "4x4x244", "4x8x124", "12x12x28", "16x16x16",
    "4x20x52", "8x12x44", "8x8x68", "4x12x92", "8x20x28", "12x16x24", "4x8x148", "12x20x20",
    "8x8x76", "4x28x44", "8x12x52", "16x16x20", "12x12x36", "4x8x164", "12x16x28", "4x20x68",
    "4x8x172", "4x12x116", "8x16x44", "12x20x24", "4x28x52", "8x8x92", "4x12x124", "4x8x188",
    "4x20x76", "16x16x24", "12x24x24", "16x20x28",
];

/// TPU7x's sizes beyond v5p's list (\[xpk\]), and its one-chip slice.
const TPU7X_MORE: &[&str] = &["16x16x32", "16x24x24"];

const FAMILIES: &[Family] = &[
    Family {
        prefix: "v2",
        alias: None,
        generation: "v2",
        per_chip: 2,
        host_block: [2, 2, 1],
        shapes: &["2x2", "4x4", "8x8", "8x16", "16x16"],
    },
    Family {
        prefix: "v3",
        alias: None,
        generation: "v3",
        per_chip: 2,
        host_block: [2, 2, 1],
        shapes: &[
            "2x2", "4x4", "8x4", "8x8", "8x16", "16x16", "16x32", "32x32",
        ],
    },
    Family {
        prefix: "v4",
        alias: None,
        generation: "v4",
        per_chip: 2,
        host_block: [2, 2, 1],
        shapes: &[
            "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x12",
            "8x8x16", "8x16x16", "16x16x16",
        ],
    },
    Family {
        prefix: "v5litepod",
        alias: Some("v5e"),
        generation: "v5e",
        per_chip: 1,
        host_block: [2, 4, 1],
        shapes: TWO_D,
    },
    Family {
        prefix: "v5p",
        alias: None,
        generation: "v5p",
        per_chip: 2,
        host_block: [2, 2, 1],
        shapes: CUBE_BUILT,
    },
    Family {
        prefix: "v6e",
        alias: None,
        generation: "v6e",
        per_chip: 1,
        host_block: [2, 4, 1],
        shapes: TWO_D,
    },
    Family {
        prefix: "tpu7x",
        alias: None,
        generation: "tpu7x",
        per_chip: 2,
        host_block: [2, 2, 1],
        shapes: &[],
    },
];

/// One Cloud accelerator type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudType {
    /// Cloud's name (`v5p-1024`, `v5litepod-16`).
    pub name: String,
    /// Another name for the same type (`v5e-16`), if any.
    pub alias: Option<String>,
    /// The generation, as in pod files (`v5e`).
    pub generation: &'static str,
    /// The slice's shape (`8x8x8`).
    pub shape: &'static str,
    /// Chips in the slice.
    pub chips: u32,
    /// Hosts (VMs of the generation's host block) driving it.
    pub hosts: u32,
}

impl CloudType {
    /// What the name counts: `"TensorCores"` or `"chips"`.
    pub fn counts(&self) -> &'static str {
        if family(self.generation).per_chip == 2 {
            "TensorCores"
        } else {
            "chips"
        }
    }
}

fn family(generation: &str) -> &'static Family {
    FAMILIES
        .iter()
        .find(|f| f.generation == generation)
        .expect("a family per generation")
}

fn family_shapes(family: &Family) -> Vec<&'static str> {
    if family.prefix == "tpu7x" {
        let mut shapes = vec!["1x1x1"];
        shapes.extend(CUBE_BUILT);
        shapes.extend(TPU7X_MORE);
        shapes
    } else {
        family.shapes.to_vec()
    }
}

fn dims(shape: &str) -> [u32; 3] {
    let mut dims = [1u32; 3];
    for (axis, extent) in shape.split('x').enumerate() {
        dims[axis] = extent.parse().expect("a catalogue shape");
    }
    dims
}

/// Every Cloud accelerator type, family by family, smallest first.
pub fn cloud_types() -> &'static [CloudType] {
    static TYPES: LazyLock<Vec<CloudType>> = LazyLock::new(|| {
        let mut types = Vec::new();
        for family in FAMILIES {
            let mut shapes = family_shapes(family);
            shapes.sort_by_key(|shape| dims(shape).iter().product::<u32>());
            for shape in shapes {
                let dims = dims(shape);
                let chips: u32 = dims.iter().product();
                let hosts = (0..3)
                    .map(|axis| dims[axis] / family.host_block[axis].min(dims[axis]))
                    .product();
                let number = chips * family.per_chip;
                types.push(CloudType {
                    name: format!("{}-{number}", family.prefix),
                    alias: family.alias.map(|alias| format!("{alias}-{number}")),
                    generation: family.generation,
                    shape,
                    chips,
                    hosts,
                });
            }
        }
        types
    });
    &TYPES
}

/// The Cloud accelerator type `name` names (by its name or its alias).
pub fn cloud_type(name: &str) -> Option<&'static CloudType> {
    cloud_types()
        .iter()
        .find(|t| t.name == name || t.alias.as_deref() == Some(name))
}

/// The RON text of a preset: a bundled file, or a generated pod file for
/// any other Cloud accelerator type (named as asked: `v5e-16` or
/// `v5litepod-16`).
pub fn preset_text(name: &str) -> Option<Cow<'static, str>> {
    if let Some((_, text)) = PRESETS.iter().find(|(preset, _)| *preset == name) {
        return Some(Cow::Borrowed(text));
    }
    let cloud = cloud_type(name)?;
    let description = format!(
        "{} TPU {} chips ({} {}: Cloud type {}), {}, {} host{}",
        cloud.chips,
        cloud.generation,
        cloud.chips * family(cloud.generation).per_chip,
        cloud.counts(),
        cloud.name,
        cloud.shape,
        cloud.hosts,
        if cloud.hosts == 1 { "" } else { "s" },
    );
    Some(Cow::Owned(format!(
        "Pod(\n    name: \"{name}\",\n    description: \"{description}\",\n    \
         generation: \"{}\",\n    shape: \"{}\",\n)\n",
        cloud.generation, cloud.shape
    )))
}

/// Every preset name (Cloud's names, then the aliases), for did-you-mean.
pub fn all_names() -> impl Iterator<Item = &'static str> {
    let types = cloud_types();
    types
        .iter()
        .map(|t| t.name.as_str())
        .chain(types.iter().filter_map(|t| t.alias.as_deref()))
}

/// The families' ranges, for error messages: `v2-8 … v2-512, ...`.
pub fn preset_names() -> String {
    let ranges: Vec<String> = FAMILIES
        .iter()
        .map(|family| {
            let mine: Vec<&CloudType> = cloud_types()
                .iter()
                .filter(|t| t.generation == family.generation)
                .collect();
            let (first, last) = (mine[0], mine[mine.len() - 1]);
            let alias = family
                .alias
                .map(|a| format!(" (or {a}-N)"))
                .unwrap_or_default();
            format!("{} … {}{alias}", first.name, last.name)
        })
        .collect();
    format!(
        "Cloud TPU accelerator types {} (`optirs-tpu presets` lists them)",
        ranges.join(", ")
    )
}

/// Why a name of a family's form (`v5p-1000`) is not a Cloud type, and
/// the name to use: the Cloud type of that many chips, else the nearest
/// size. `None` when `name` is not of a family's form.
pub fn not_a_cloud_size(name: &str) -> Option<(String, String)> {
    let (prefix, number) = name.rsplit_once('-')?;
    let number: u64 = number.parse().ok()?;
    let family = FAMILIES
        .iter()
        .find(|f| f.prefix == prefix || f.alias == Some(prefix))?;
    let mine = || {
        cloud_types()
            .iter()
            .filter(move |t| t.generation == family.generation)
    };
    let per_chip = u64::from(family.per_chip);
    let counts = if per_chip == 2 {
        "TensorCores, 2 a chip"
    } else {
        "chips"
    };
    let shown = |t: &CloudType| {
        if prefix == family.prefix {
            t.name.clone()
        } else {
            t.alias.clone().unwrap_or_else(|| t.name.clone())
        }
    };
    let same_chips = (per_chip == 2)
        .then(|| mine().find(|t| u64::from(t.chips) == number))
        .flatten();
    let (hint, suggestion) = match same_chips {
        Some(t) => (
            format!(
                "{prefix} names count {counts}; {number} chips ({}) is `{}`",
                t.shape,
                shown(t)
            ),
            shown(t),
        ),
        None => {
            let nearest = mine()
                .min_by_key(|t| (u64::from(t.chips) * per_chip).abs_diff(number))
                .expect("a family has sizes");
            (
                format!(
                    "{prefix} names count {counts}; the nearest size is `{}` ({} chips, {})",
                    shown(nearest),
                    nearest.chips,
                    nearest.shape
                ),
                shown(nearest),
            )
        }
    };
    Some((hint, suggestion))
}

/// The note for a name whose meaning changed when presets took Cloud's
/// names: what it means now and what the old pod is called.
pub fn renamed_note(name: &str) -> Option<String> {
    let (_, now) = RENAMED.iter().find(|(old, _)| *old == name)?;
    let cloud = cloud_type(name)?;
    Some(format!(
        "`{name}` is Cloud's {name}: {} chips ({}); the {}-chip pod this name meant before \
         Cloud's names is `{now}`",
        cloud.chips,
        cloud.shape,
        cloud.chips * 2
    ))
}
