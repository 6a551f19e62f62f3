//! No input makes the pod loader panic: arbitrary bytes, and presets mutated
//! byte by byte, either load into a working pod or return an error.

use optirs_tpu::Pod;
use optirs_tpu::topology::{PRESETS, parse_topology};
use proptest::prelude::*;

/// Loads `text`; when it is accepted, the pod must build and step.
fn load_or_reject(text: &str) {
    if let Ok(topology) = parse_topology(text, "fuzz.ron") {
        // Large pods are valid but slow to spawn in a debug build.
        if topology.num_devices() <= 4096 {
            let mut pod = Pod::from_topology(topology).expect("a valid topology builds a pod");
            pod.step();
            let _ = pod.figures();
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, u8),
    Delete(usize, usize),
    Insert(usize, String),
    Digits(usize, u32),
}

fn apply(text: &str, mutations: &[Mutation]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for mutation in mutations {
        let len = bytes.len().max(1);
        match mutation {
            Mutation::Replace(at, byte) => {
                if !bytes.is_empty() {
                    bytes[at % len] = *byte;
                }
            }
            Mutation::Delete(at, count) => {
                let start = at % len;
                let end = (start + count).min(bytes.len());
                if start < end {
                    bytes.drain(start..end);
                }
            }
            Mutation::Insert(at, insert) => {
                let at = (at % len).min(bytes.len());
                bytes.splice(at..at, insert.bytes());
            }
            Mutation::Digits(at, number) => {
                // Replace the next run of digits with another number.
                let start = at % len;
                if let Some(offset) = bytes[start.min(bytes.len())..]
                    .iter()
                    .position(u8::is_ascii_digit)
                {
                    let begin = start + offset;
                    let end = bytes[begin..]
                        .iter()
                        .position(|b| !b.is_ascii_digit())
                        .map_or(bytes.len(), |e| begin + e);
                    bytes.splice(begin..end, number.to_string().bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Replace(a, b)),
        (any::<usize>(), 0usize..12).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (
            any::<usize>(),
            prop_oneof![
                Just("x".to_string()),
                Just("0".to_string()),
                Just(",".to_string()),
                Just("(".to_string()),
                Just(")".to_string()),
                Just("\"".to_string()),
                Just("-1".to_string()),
                Just("1e400".to_string()),
                Just("NaN".to_string()),
                Just("slices: 3,".to_string()),
                Just("wraparound: [true, true, true],".to_string()),
                Just("extra_links: [(a: 0, b: 4000000000, kind: Dcn)],".to_string()),
                Just("tick_ms: 1e-12,".to_string()),
                Just("custom: true,".to_string()),
                Just("twist: \"twisted\",".to_string()),
                Just("dcn: (fabric: true, oversubscription: 0.0),".to_string()),
                Just("slices: 65536, custom: true,".to_string()),
                "[ -~]{0,8}",
            ]
        )
            .prop_map(|(a, s)| Mutation::Insert(a, s)),
        (any::<usize>(), any::<u32>()).prop_map(|(a, n)| Mutation::Digits(a, n)),
        (any::<usize>(), 0u32..40).prop_map(|(a, n)| Mutation::Digits(a, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        load_or_reject(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_presets_never_panic(
        preset in 0..PRESETS.len(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        load_or_reject(&apply(PRESETS[preset].1, &mutations));
    }
}

#[test]
fn a_digit_mutation_that_zeroes_a_dimension_is_an_error() {
    // `Digits` turning 16x16 into 0x16 must be a clean error.
    let at = PRESETS[6].1.find("\"16x16\"").unwrap();
    let text = apply(PRESETS[6].1, &[Mutation::Digits(at, 0)]);
    assert!(text.contains("\"0x16\""), "{text}");
    assert!(parse_topology(&text, "t").is_err());
}
