//! The transfer stage: each batch's columns copied to the `LOCAL_RANK`
//! device on the worker's own stream.

#[cfg(feature = "cuda")]
use std::sync::Arc;

use ferrofeed_core::{Batch, BatchStage, BoxError};

#[cfg(feature = "cuda")]
use super::cuda;
use super::{device_count, local_device, CudaError};

/// How hard to insist on copying batches to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    /// Keep batches on the host.
    Off,
    /// Copy to the `LOCAL_RANK` device when there is one, else keep batches
    /// on the host (one log line says so).
    Auto,
    /// Copy or fail.
    Strict,
}

/// The device copies of a batch's columns, attached to the batch by
/// [`Transfer`]. The copies are complete when the batch arrives.
pub struct DeviceColumns {
    /// Device ordinal.
    pub device: usize,
    #[cfg(feature = "cuda")]
    columns: Vec<(String, cudarc::driver::CudaSlice<u8>)>,
    #[cfg(feature = "cuda")]
    copier: Arc<cuda::Copier>,
}

impl DeviceColumns {
    /// Names of the columns on the device.
    pub fn names(&self) -> Vec<&str> {
        #[cfg(feature = "cuda")]
        {
            self.columns.iter().map(|(n, _)| n.as_str()).collect()
        }
        #[cfg(not(feature = "cuda"))]
        {
            Vec::new()
        }
    }
    /// The device buffer of column `name`.
    #[cfg(feature = "cuda")]
    pub fn get(&self, name: &str) -> Option<&cudarc::driver::CudaSlice<u8>> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }
    /// Copies column `name` back to the host (for checks).
    pub fn to_host(&self, name: &str) -> Result<Vec<u8>, CudaError> {
        #[cfg(feature = "cuda")]
        {
            let d = self
                .get(name)
                .ok_or_else(|| CudaError::Driver(format!("no column `{name}` on the device")))?;
            self.copier.dtoh(d)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = name;
            Err(CudaError::NotBuilt)
        }
    }
}

/// Copies every column of each batch to the device, in the worker that
/// built it, on a stream of its own.
pub struct Transfer {
    #[cfg(feature = "cuda")]
    copier: Option<Arc<cuda::Copier>>,
    device: Option<usize>,
    reason: Option<String>,
}

impl Transfer {
    /// A transfer to the `LOCAL_RANK` device (see [`TransferMode`]).
    pub fn new(mode: TransferMode) -> Result<Transfer, CudaError> {
        let none = |reason: Option<String>| Transfer {
            #[cfg(feature = "cuda")]
            copier: None,
            device: None,
            reason,
        };
        if mode == TransferMode::Off {
            return Ok(none(None));
        }
        let device = device_count()
            .and_then(|n| local_device(std::env::var("LOCAL_RANK").ok().as_deref(), n));
        match device {
            Ok(ordinal) => Self::to_device(ordinal),
            Err(e) if mode == TransferMode::Strict => Err(e),
            Err(e) => {
                let line = format!("{e}: batches stay in host memory");
                tracing::warn!("{line}");
                Ok(none(Some(line)))
            }
        }
    }

    /// A transfer to device `ordinal`.
    pub fn to_device(ordinal: usize) -> Result<Transfer, CudaError> {
        #[cfg(feature = "cuda")]
        {
            Ok(Transfer {
                copier: Some(Arc::new(cuda::Copier::new(ordinal)?)),
                device: Some(ordinal),
                reason: None,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(CudaError::NotBuilt)
        }
    }

    /// The device batches go to, if any.
    pub fn device(&self) -> Option<usize> {
        self.device
    }
    /// Why batches stay on the host (`Auto` without a device).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }
}

impl BatchStage for Transfer {
    fn process(&self, batch: &mut Batch) -> Result<(), BoxError> {
        #[cfg(feature = "cuda")]
        if let (Some(copier), Some(device)) = (&self.copier, self.device) {
            let mut columns = Vec::new();
            for (name, t) in batch.columns() {
                columns.push((name.to_string(), copier.htod(t.as_bytes())?));
            }
            // The consumer gets the batch with its copies finished.
            copier.synchronize()?;
            batch.attach(DeviceColumns {
                device,
                columns,
                copier: Arc::clone(copier),
            });
        }
        let _ = batch;
        Ok(())
    }
}
