//! Device tests that hold on machines with and without CUDA.

use super::{device_count, local_device, CudaError, PinMode, PinnedPool, Transfer, TransferMode};
use ferrofeed_core::BufferSource;

#[test]
fn local_rank_is_checked_against_the_devices() {
    assert_eq!(local_device(None, 2), Ok(0));
    assert_eq!(local_device(Some("1"), 2), Ok(1));
    assert_eq!(
        local_device(Some("3"), 2),
        Err(CudaError::RankPastDevices { rank: 3, count: 2 })
    );
    assert!(matches!(
        local_device(Some("x"), 2),
        Err(CudaError::BadLocalRank(_))
    ));
    assert_eq!(
        CudaError::RankPastDevices { rank: 3, count: 2 }.to_string(),
        "LOCAL_RANK 3 is past the 2 CUDA device(s) of this machine"
    );
}

#[test]
fn buffers_are_recycled_and_never_shared_while_lent() {
    let pool = PinnedPool::new(PinMode::Off, 2).unwrap();
    const KB: usize = 1 << 10;
    let mut a = pool.take(100 * KB);
    a.as_bytes_mut()[..4].copy_from_slice(&[1, 2, 3, 4]);
    let b = pool.take(100 * KB);
    assert_ne!(
        a.as_bytes().as_ptr(),
        b.as_bytes().as_ptr(),
        "a lent buffer is not lent twice"
    );
    assert_eq!(&a.as_bytes()[..4], &[1, 2, 3, 4]);
    let pa = a.as_bytes().as_ptr();
    drop(a);
    let c = pool.take(90 * KB);
    assert_eq!(c.as_bytes().as_ptr(), pa, "a returned buffer is reused");
    assert_eq!(
        (pool.allocated(), pool.lent(), pool.high_water()),
        (2, 2, 2)
    );
    // Every buffer lent: after a short wait, unpooled memory, bound kept.
    let d = pool.take(100 * KB);
    assert_eq!(pool.fallbacks(), 1);
    assert_eq!(pool.allocated(), 2);
    drop((b, c, d));
    assert_eq!(pool.lent(), 0);
    // A request larger than any free buffer replaces one.
    let big = pool.take(1000 * KB);
    assert!(big.as_bytes().len() >= 1000 * KB);
    // Small tensors do not touch the pool.
    let small = pool.take(512);
    assert_eq!((pool.lent(), pool.fallbacks()), (1, 1));
    drop(small);
    assert_eq!(pool.allocated(), 2);
}

#[test]
fn without_a_device_auto_falls_back_and_strict_refuses() {
    if device_count().is_ok() {
        return; // a CUDA machine: covered by bench/gpu_check.sh
    }
    let pool = PinnedPool::new(PinMode::Auto, 2).unwrap();
    assert!(!pool.is_pinned());
    let reason = pool.fallback_reason().unwrap();
    assert!(reason.starts_with("no CUDA device"), "{reason}");
    assert!(
        reason.ends_with("pin falls back to host memory"),
        "{reason}"
    );
    let e = PinnedPool::new(PinMode::Strict, 2).unwrap_err();
    assert!(e.to_string().starts_with("no CUDA device"), "{e}");
    let t = Transfer::new(TransferMode::Auto).unwrap();
    assert_eq!(t.device(), None);
    assert!(t
        .fallback_reason()
        .unwrap()
        .contains("batches stay in host memory"));
    assert!(Transfer::new(TransferMode::Strict).is_err());
    assert!(PinnedPool::new(PinMode::Off, 2)
        .unwrap()
        .fallback_reason()
        .is_none());
}
