//! Negative tests of the rules of planned outputs.

use super::*;

#[test]
fn check_output_buffer() {
    rejects(|case| {
        let b = case.plan.outputs[0].buffer;
        case.plan.outputs[0].buffer = b + 1000;
        let message = format!("goes to buffer {}, not {b}", b + 1000);
        ("output 0".into(), message)
    });
}

#[test]
fn check_output_stage() {
    rejects(|case| {
        let o = case.donated();
        let (i, _) = case.kernel().outputs[o];
        case.plan.outputs[o].prelude = Some(i);
        let message = format!("is loop instruction {i}, planned as a prelude value");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_loop_output_written() {
    rejects(|case| {
        let o = case.direct();
        case.undirect(o);
        case.plan.outputs[o].direct = true;
        let message = "is direct, but no instruction writes it".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_loop_output_written_rejects_the_wrong_register() {
    rejects(|case| {
        let o = case.direct();
        case.undirect(o);
        let (i, _) = case.kernel().outputs[o];
        let reg = case.plan.outputs[o].reg;
        let js = case.kernel_instrs();
        // Another register, and the value it holds after the body.
        let (r2, held) = (case.plan.body.iter().enumerate().rev())
            .find_map(|(at, b)| (b.direct.is_none() && b.reg != reg).then_some((b.reg, js[at].1)))
            .expect("another register");
        case.plan.outputs[o].reg = r2;
        let message = format!(
            "is copied from register {r2}, which holds {:?} after the body, not kernel \
             instruction {i}",
            Some(held)
        );
        (format!("output {o}"), message)
    });
}

#[test]
fn check_aliased_output_has_donor() {
    rejects(|case| {
        let o = case.donated();
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        assert!(case.plan.outputs[o].aliased);
        case.plan.outputs[o].donor = None;
        let message = "is aliased without a donor input".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_is_buffer_input() {
    rejects(|case| {
        let o = case.donated();
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        case.plan.outputs[o].donor = Some(999);
        let message = "is placed over input 999, which is not a buffer".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_donates_once() {
    rejects(|case| {
        let first = case.donated();
        let o = (first + 1..case.plan.outputs.len())
            .find(|&o| case.plan.outputs[o].donor.is_some())
            .expect("two outputs over donors");
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        let d = case.plan.outputs[first].donor.unwrap();
        case.plan.outputs[o].donor = Some(d);
        let message = format!("is placed over input {d}, which another output takes");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_read_last_here() {
    rejects(|case| {
        let o = case.donated();
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        // A later kernel reads the donor.
        case.last_use[ib as usize] = case.k + 1;
        let message =
            format!("is placed over input {d} (buffer {ib}), which is read after this kernel");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_type() {
    rejects(|case| {
        let o = case.donated();
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        let b = case.plan.outputs[o].buffer as usize;
        // The output's buffer takes another type (no input of the kernel
        // reads it, so only the donor's type is then wrong).
        let to = "f64[3]".to_owned();
        case.exe.buffers[b].ty = to.clone();
        let from = &case.exe.buffers[ib as usize].ty;
        let message = format!("is {to}, placed over input {d} of type {from}");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_placement() {
    rejects(|case| {
        let o = case.donated();
        assert!(case.plan.outputs[o].aliased);
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        // The plan was made with aliases the runtime no longer gives.
        case.aliases.clear();
        let message = format!(
            "is placed over input {d} (buffer {ib}), which is not the parameter it is aliased to"
        );
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_not_read_after_direct_write() {
    rejects(|case| {
        let kernel = case.kernel().clone();
        let reads = |b: &BodyInstr, d: u32| {
            (b.args.iter()).any(|a| matches!(*a, Src::Input(y) | Src::InputScalar(y) if y == d))
        };
        // A direct output, and a buffer input of its type that no output
        // takes and the body reads after the output's writer.
        let (o, w, d, ib, r) = (0..case.plan.outputs.len())
            .filter(|&o| case.plan.outputs[o].direct)
            .find_map(|o| {
                let w = case.writer(o);
                let to = &case.exe.buffers[case.plan.outputs[o].buffer as usize];
                kernel.inputs.iter().enumerate().find_map(|(d, r)| {
                    let (d, &ValueRef::Buffer(ib)) = (d as u32, r) else {
                        return None;
                    };
                    let from = &case.exe.buffers[ib as usize];
                    let free = case.plan.outputs.iter().all(|x| x.donor != Some(d))
                        && case.last_use[ib as usize] == case.k;
                    let r =
                        (w + 1..case.plan.body.len()).find(|&r| reads(&case.plan.body[r], d))?;
                    (free && from.ty == to.ty).then_some((o, w, d, ib, r))
                })
            })
            .expect("an input read after a direct output is written");
        // Its instruction reads its own donor as an input, and the output is
        // placed over `d` by the memory plan.
        for a in &mut case.plan.body[w].args {
            if let Src::Dest(x) = *a {
                *a = Src::Input(x);
            }
        }
        let b = case.plan.outputs[o].buffer as usize;
        case.exe.buffers[b].offset = case.exe.buffers[ib as usize].offset;
        let out = &mut case.plan.outputs[o];
        out.donor = Some(d);
        out.aliased = false;
        let message = format!(
            "is written over input {d} by body instruction {w}, but body instruction {r} reads \
             that input afterwards"
        );
        (format!("output {o}"), message)
    });
}
