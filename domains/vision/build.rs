//! Builds the libjpeg(-turbo) region decoder when the system has libjpeg's
//! headers and library; otherwise the crate decodes with zune-jpeg alone.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(ff_libjpeg)");
    println!("cargo::rerun-if-changed=csrc/ffjpeg.c");
    println!("cargo::rerun-if-env-changed=FERROFEED_NO_LIBJPEG");
    if std::env::var_os("FERROFEED_NO_LIBJPEG").is_some() {
        return;
    }
    let mut build = cc::Build::new();
    build.file("csrc/ffjpeg.c").opt_level(2).warnings(false);
    match build.try_compile("ffjpeg") {
        Ok(()) => {
            println!("cargo::rustc-link-lib=jpeg");
            println!("cargo::rustc-cfg=ff_libjpeg");
        }
        Err(e) => {
            println!(
                "cargo::warning=could not build the libjpeg region decoder ({e}); JPEGs decode with zune-jpeg only \
                 (install libjpeg62-turbo-dev or libjpeg-turbo8-dev for region decoding)"
            );
        }
    }
}
