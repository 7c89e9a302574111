//! Mutation fuzzer for narwhal_core's `StreamSession`: seeds from real vLLM captures and
//! synthetic streams, grammar-aware mutations, every option combination, random read
//! boundaries. Panics, hangs and broken properties are written to `fuzz/findings/`.
//!
//! Usage: `cargo run --release -- [--inputs N] [--seconds S] [--seed X] [--corpus DIR]`

mod check;
mod mutate;
mod rng;
mod seeds;

use std::panic;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rng::Rng;

struct Args {
    inputs: u64,
    seconds: f64,
    seed: u64,
    corpus: PathBuf,
}

fn parse_args() -> Args {
    let mut args = Args {
        inputs: 1_000_000,
        seconds: f64::INFINITY,
        seed: 1,
        corpus: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/transcripts"
        )),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--inputs" => args.inputs = value.parse().expect("--inputs N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds S"),
            "--seed" => args.seed = value.parse().expect("--seed X"),
            "--corpus" => args.corpus = PathBuf::from(value),
            _ => panic!("unknown flag {flag}"),
        }
    }
    args
}

fn main() {
    let args = parse_args();
    let mut corpus = seeds::from_transcripts(&args.corpus);
    let real = corpus.len();
    corpus.extend(seeds::synthetic());
    let modes = check::all_modes();
    let findings = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/findings"));
    panic::set_hook(Box::new(|_| {})); // panics are reported below, with their input
    let mut rng = Rng::new(args.seed);
    let started = Instant::now();
    let limit = Duration::from_secs_f64(args.seconds.min(1e9));
    let (mut done, mut failures, mut checks, mut slowest) = (0u64, 0u64, 0u64, Duration::ZERO);
    let mut ends = [0u64; 4]; // open, done, failed, assembled
    while done < args.inputs && started.elapsed() < limit {
        let mut input = match rng.below(20) {
            0 => (0..rng.below(512)).map(|_| rng.next_u64() as u8).collect(),
            _ => rng.pick(&corpus).clone(),
        };
        let other = rng.pick(&corpus).clone();
        if !input.is_empty() || rng.chance(2) {
            mutate::mutate(&mut rng, &mut input, &other);
        }
        // every input in two modes chosen at random (all 128 are covered many times over)
        for _ in 0..2 {
            let opts = *rng.pick(&modes);
            let mut local = Rng::new(rng.next_u64());
            let t = Instant::now();
            let result = panic::catch_unwind(panic::AssertUnwindSafe(|| {
                check::check(&mut local, opts, &input)
            }));
            let took = t.elapsed();
            slowest = slowest.max(took);
            checks += 1;
            let problem = match result {
                Ok(Ok(end)) if took < Duration::from_secs(1) => {
                    ends[end] += 1;
                    continue;
                }
                Ok(Ok(_)) => format!("slow input: {took:?}"),
                Ok(Err(broken)) => broken,
                Err(payload) => format!("panic: {}", panic_text(&payload)),
            };
            failures += 1;
            report(&findings, failures, opts, &input, &problem);
        }
        done += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "narwhal_fuzz: {done} inputs, {checks} session runs (x2 read splits), {failures} findings, \
         {real} transcript + {} synthetic seeds, {:.0} inputs/s, slowest run {slowest:?}; \
         runs ending open {}, done {}, failed {}, assembled {}",
        corpus.len() - real,
        done as f64 / secs,
        ends[0],
        ends[1],
        ends[2],
        ends[3]
    );
    if failures > 0 {
        std::process::exit(1);
    }
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

fn report(
    dir: &PathBuf,
    n: u64,
    opts: narwhal_core::session::Options,
    input: &[u8],
    problem: &str,
) {
    if n <= 5 {
        eprintln!(
            "FINDING {n}: {problem}\n  mode {opts:?}\n  input {}",
            check::lossy(input)
        );
    }
    if n <= 50 {
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(dir.join(format!("finding-{n}.bin")), input);
        let _ = std::fs::write(
            dir.join(format!("finding-{n}.txt")),
            format!("{problem}\nmode {opts:?}\n"),
        );
    }
}
