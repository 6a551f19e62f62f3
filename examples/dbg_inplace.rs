use ndarray::Array1;
fn main() {
    let n = 10_000_000;
    let mut p = Array1::from_iter((0..n).map(|i| (i % 100) as f32 * 0.01));
    let g = Array1::from_iter((0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.1));
    let mut opt = optirs_tpu::TPUOptimizer::new(
        optirs_tpu::optimizers::Adam::new(1e-3f32),
        Default::default(),
    )
    .unwrap();
    opt.tpu_step_in_place(&mut p, &g).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..50 {
        opt.tpu_step_in_place(&mut p, &g).unwrap();
    }
    println!("{:.2} ms/step", t.elapsed().as_secs_f64() * 1e3 / 50.0);
}
