//! Runs [`optirs_tpu::tpu::bench_optimizer`] from the command line:
//! `cargo run --release --example bench_optimizer -- adam 10000000 20`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("adam", String::as_str);
    let size = args.get(1).map_or(Ok(10_000_000), |s| s.parse())?;
    let steps = args.get(2).map_or(Ok(20), |s| s.parse())?;
    let bench = optirs_tpu::tpu::bench_optimizer(name, size, steps)?;
    println!("{bench}");
    println!("{}", serde_json::to_string(&bench)?);
    Ok(())
}
