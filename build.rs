//! Probes the target into cfgs. fibra needs Linux (futex, epoll, `MADV_GUARD_INSTALL` with
//! an `mprotect` fallback) on an architecture corosensei supports; anything else fails here
//! with a clear message instead of deep inside the build.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // `loom` is set by the model-checking CI step (RUSTFLAGS="--cfg loom").
    println!("cargo::rustc-check-cfg=cfg(loom)");

    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os != "linux" {
        eprintln!("fibra supports Linux only (futex, epoll); the target OS is {os:?}");
        std::process::exit(1);
    }
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if std::env::var_os("CARGO_FEATURE_HOOK").is_some() && env != "gnu" {
        eprintln!(
            "fibra's `hook` feature needs glibc (it finds the real functions with \
             dlsym(RTLD_NEXT)); the target environment is {env:?}"
        );
        std::process::exit(1);
    }
    if !matches!(arch.as_str(), "x86_64" | "aarch64" | "riscv64") {
        eprintln!("fibra needs a corosensei-supported 64-bit architecture; the target is {arch:?}");
        std::process::exit(1);
    }
}
