//! The `ferrofeed._ferrofeed` extension module: ferrofeed's domain jobs as
//! Python loaders. The options are the command's flags, read through the
//! library's one layer ([`ferrofeed::jobs`]); an epoch runs on a driver
//! thread that hands batches over a one-slot channel, so the interpreter
//! waits for a batch with the GIL released and still sees Ctrl-C.
//!
//! ```text
//! Loader(domain, path, options) ─ __iter__ → driver thread: pipeline.epoch(e) ─▶ (batch, state) ─▶ __next__
//! ```
mod array;
mod loader;

use pyo3::prelude::*;

#[pymodule]
fn _ferrofeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", ferrofeed::VERSION)?;
    m.add_class::<array::Array>()?;
    m.add_class::<loader::Loader>()?;
    m.add_function(wrap_pyfunction!(loader::flags, m)?)?;
    Ok(())
}
