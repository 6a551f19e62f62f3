//! `train --model --modeled-only --trace FILE`: the modeled step as a
//! Chrome/Perfetto trace, and a pipelined step's schedule per stage.

use optirs_tpu::profile::trace::{Event, Scope, Trace};
use optirs_tpu::step_model::{ModelStep, PipelineStep};

/// The step as a Chrome/Perfetto trace: one device (every device of the
/// symmetric pod does the same), its compute on track 0 (each layer's
/// forward and backward use, the logits between, the updates), its
/// communication on track 1 (each layer's gathers, its gradient's
/// reduce-scatter and all-reduce), each free an instant.
pub(super) fn trace_of(step: &ModelStep) -> optirs_tpu::profile::trace::Trace {
    use optirs_tpu::cost_model::SpanKind;
    let mut trace = Trace::new();
    trace
        .process(
            0,
            format!("{} on {} chips (each alike)", step.model, step.chips),
        )
        .thread(0, 0, "compute")
        .thread(0, 1, "communication");
    let layers = step.strategy_step.buckets.saturating_sub(1);
    let name = |bucket: u32| {
        if bucket as usize >= layers {
            "embedding".to_string()
        } else {
            format!("layer {bucket}")
        }
    };
    for s in &step.strategy_step.spans {
        let (what, tid) = match s.kind {
            SpanKind::Gather { backward } => (format!("gather ({})", pass(backward)), 1),
            SpanKind::Use { backward } => (pass(backward).to_string(), 0),
            SpanKind::Free { backward } => {
                trace.push(
                    Event::instant(
                        format!("free {} ({})", name(s.bucket), pass(backward)),
                        s.start_seconds * 1e6,
                        Scope::Thread,
                    )
                    .category("memory")
                    .on(0, 0),
                );
                continue;
            }
            SpanKind::ReduceScatter => ("gradient reduce-scatter".to_string(), 1),
            SpanKind::DataReduction => ("gradient all-reduce over data".to_string(), 1),
            SpanKind::Update => ("update".to_string(), 0),
            SpanKind::AllGather => ("all-gather".to_string(), 1),
            SpanKind::ReplicateState => ("state copy".to_string(), 1),
            SpanKind::Between => {
                trace.push(
                    Event::complete(
                        "logits and loss",
                        s.start_seconds * 1e6,
                        (s.end_seconds - s.start_seconds) * 1e6,
                    )
                    .category("compute")
                    .on(0, 0),
                );
                continue;
            }
        };
        let category = if tid == 0 { "compute" } else { "communication" };
        trace.push(
            Event::complete(
                format!("{what} {}", name(s.bucket)),
                s.start_seconds * 1e6,
                (s.end_seconds - s.start_seconds).max(0.0) * 1e6,
            )
            .category(category)
            .on(0, tid),
        );
    }
    if let Some(pipeline) = &step.pipeline {
        draw_pipeline(&mut trace, pipeline);
    }
    trace
}

/// The pipeline's schedule as a process of its own, one track per stage:
/// each slot a microbatch through a run of the stage's layers, the gaps the
/// bubble.
fn draw_pipeline(trace: &mut Trace, pipeline: &PipelineStep) {
    trace.process(
        1,
        format!(
            "pipeline: {} stages, {} microbatches, {} rounds (the passes' slots, from each \
             pass's start)",
            pipeline.stages, pipeline.microbatches, pipeline.repeats
        ),
    );
    for stage in 0..pipeline.stages {
        trace.thread(1, stage as u32, format!("stage {stage}"));
    }
    for slot in pipeline.schedule() {
        trace.push(
            Event::complete(
                format!(
                    "{} microbatch {} round {}",
                    pass(slot.backward),
                    slot.microbatch,
                    slot.repeat
                ),
                slot.start_seconds * 1e6,
                (slot.end_seconds - slot.start_seconds) * 1e6,
            )
            .category("pipeline")
            .on(1, slot.stage as u32),
        );
    }
}

fn pass(backward: bool) -> &'static str {
    if backward { "backward" } else { "forward" }
}
