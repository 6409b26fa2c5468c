//! The map-style source over listed objects and the stage that downloads
//! them.
//!
//! ```
//! use std::sync::Arc;
//! use ferrofeed_core::Source;
//! use ferrofeed_stages::remote::{ObjectKey, Remote, RemoteFiles, RemoteOptions, RemoteUrl};
//! use object_store::{memory::InMemory, ObjectStoreExt, path::Path};
//! let store = Arc::new(InMemory::new());
//! let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! rt.block_on(store.put(&Path::from("train/cat/a.jpg"), b"JPEG".to_vec().into())).unwrap();
//! let dir = tempfile::tempdir().unwrap();
//! let url = RemoteUrl::parse("s3://bucket/train").unwrap();
//! let remote = Arc::new(Remote::with_store(url, store, RemoteOptions::new(dir.path().into())).unwrap());
//! let files = RemoteFiles::new(Arc::clone(&remote), vec![(0, 3)]);
//! assert_eq!(files.key(0).as_deref(), Some("s3://bucket/train/cat/a.jpg"));
//! let (key, label) = files.get(0).unwrap();
//! assert_eq!((key, label.0), (ObjectKey(0), 3));
//! assert_eq!(&remote.read(0).unwrap()[..], b"JPEG");
//! ```
use std::sync::Arc;

use ferrofeed_core::{BoxError, Component, Source, Stage, StageCtx};

use super::fetch::Remote;
use crate::components::{Bytes, Label};

/// Which listed object a sample is (its index in [`Remote::objects`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectKey(pub usize);

impl Component for ObjectKey {
    fn nbytes(&self) -> usize {
        8
    }
    fn describe(&self) -> String {
        format!("object {}", self.0)
    }
}

/// A map-style source of `(ObjectKey, Label)`; keys are the objects' URLs.
#[derive(Debug, Clone)]
pub struct RemoteFiles {
    remote: Arc<Remote>,
    items: Vec<(usize, i64)>,
}

impl RemoteFiles {
    /// Samples are `(object index, label)` pairs in order.
    pub fn new(remote: Arc<Remote>, items: Vec<(usize, i64)>) -> Self {
        RemoteFiles { remote, items }
    }
    /// The listed prefix.
    pub fn remote(&self) -> &Arc<Remote> {
        &self.remote
    }
    /// The pairs.
    pub fn items(&self) -> &[(usize, i64)] {
        &self.items
    }
    /// The epoch's object order for a plan's dataset indices.
    pub fn objects_in(&self, indices: &[u64]) -> Vec<usize> {
        indices
            .iter()
            .filter_map(|&i| self.items.get(i as usize).map(|x| x.0))
            .collect()
    }
}

impl Source for RemoteFiles {
    type Output = (ObjectKey, Label);
    fn len(&self) -> u64 {
        self.items.len() as u64
    }
    fn get(&self, index: u64) -> Result<(ObjectKey, Label), BoxError> {
        let &(o, l) = self
            .items
            .get(index as usize)
            .ok_or_else(|| format!("index {index} is past the end"))?;
        Ok((ObjectKey(o), Label(l)))
    }
    fn key(&self, index: u64) -> Option<String> {
        let &(o, _) = self.items.get(index as usize)?;
        self.remote.objects().get(o).map(|x| x.url.clone())
    }
}

/// Reads an object's bytes, from the cache or downloaded
/// (`ObjectKey → Bytes`).
#[derive(Debug, Clone)]
pub struct Download {
    /// The listed prefix.
    pub remote: Arc<Remote>,
}

impl Stage for Download {
    type In = ObjectKey;
    type Out = Bytes;
    fn process(&self, key: ObjectKey, _ctx: &StageCtx) -> Result<Bytes, BoxError> {
        self.remote.read(key.0)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
        ObjectMeta, ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload,
        PutResult, Result,
    };

    use super::*;
    use crate::remote::{RemoteError, RemoteOptions, RemoteUrl};

    /// An in-memory store whose first `cut` GETs send half the body and
    /// then fail, whose GETs fail outright while `down` is set, and whose
    /// ranged GETs fail before their body while `no_ranges` is set (as
    /// object_store does on a server that answers a range with the whole
    /// object). `ranged` counts the ranged GETs. While `paced` is set
    /// bodies come in 64 kB chunks, the first GET's stopping before its
    /// last fifth until a second body has been under way beside it (10 s
    /// at most), and `most` is the largest number of bodies under way at
    /// once; while `hold` is set too, every body stops at its half until
    /// `hold` is cleared (10 s at most).
    #[derive(Debug)]
    struct Flaky {
        inner: InMemory,
        cut: AtomicUsize,
        gets: Arc<AtomicUsize>,
        ranged: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
        no_ranges: std::sync::atomic::AtomicBool,
        paced: std::sync::atomic::AtomicBool,
        hold: Arc<std::sync::atomic::AtomicBool>,
        bodies: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        /// The key of each GET, in the order asked.
        log: std::sync::Mutex<Vec<String>>,
    }

    /// One body under way (see [`Flaky::most`]).
    struct Body(Arc<AtomicUsize>);
    impl Drop for Body {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Flaky")
        }
    }

    #[async_trait]
    impl ObjectStore for Flaky {
        async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
            self.inner.put_opts(l, p, o).await
        }
        async fn put_multipart_opts(
            &self,
            l: &Path,
            o: PutMultipartOptions,
        ) -> Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(l, o).await
        }
        async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut log) = self.log.lock() {
                log.push(l.to_string());
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "flaky",
                    source: "connection refused".into(),
                });
            }
            if o.range.is_some() {
                self.ranged.fetch_add(1, Ordering::SeqCst);
                if self.no_ranges.load(Ordering::SeqCst) {
                    return Err(object_store::Error::Generic {
                        store: "flaky",
                        source: "Received non-partial response when range requested".into(),
                    });
                }
            }
            let mut r = self.inner.get_opts(l, o).await?;
            let cut = self
                .cut
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
                .is_ok();
            if !cut && !self.paced.load(Ordering::SeqCst) {
                return Ok(r);
            }
            let GetResultPayload::Stream(s) = r.payload;
            let all: Vec<u8> = futures::StreamExt::collect::<Vec<_>>(s)
                .await
                .into_iter()
                .flat_map(|b| b.unwrap().to_vec())
                .collect();
            r.payload = if cut {
                let half = bytes::Bytes::from(all[..all.len() / 2].to_vec());
                let parts: Vec<Result<bytes::Bytes>> = vec![
                    Ok(half),
                    Err(object_store::Error::Generic {
                        store: "flaky",
                        source: "connection reset mid-body".into(),
                    }),
                ];
                GetResultPayload::Stream(Box::pin(futures::stream::iter(parts)))
            } else {
                let now = self.bodies.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                let body = Body(Arc::clone(&self.bodies));
                let chunks: Vec<bytes::Bytes> = all
                    .chunks(64 << 10)
                    .map(|c| bytes::Bytes::from(c.to_vec()))
                    .collect();
                let (n, first) = (chunks.len(), self.gets.load(Ordering::SeqCst) == 1);
                let most = Arc::clone(&self.most);
                let hold = Arc::clone(&self.hold);
                let chunks = futures::stream::iter(chunks.into_iter().enumerate());
                let paced = futures::StreamExt::then(chunks, move |(k, c)| {
                    let _in_flight = &body;
                    let (most, hold) = (Arc::clone(&most), Arc::clone(&hold));
                    async move {
                        let t = std::time::Instant::now();
                        while k * 2 >= n
                            && hold.load(Ordering::SeqCst)
                            && t.elapsed() < Duration::from_secs(10)
                        {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        while first
                            && k * 5 >= n * 4
                            && most.load(Ordering::SeqCst) < 2
                            && t.elapsed() < Duration::from_secs(10)
                        {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Ok(c)
                    }
                });
                GetResultPayload::Stream(Box::pin(paced))
            };
            Ok(r)
        }
        async fn get_ranges(&self, l: &Path, r: &[Range<u64>]) -> Result<Vec<bytes::Bytes>> {
            self.inner.get_ranges(l, r).await
        }
        fn delete_stream(
            &self,
            l: BoxStream<'static, Result<Path>>,
        ) -> BoxStream<'static, Result<Path>> {
            self.inner.delete_stream(l)
        }
        fn list(&self, p: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
            self.inner.list(p)
        }
        async fn list_with_delimiter(&self, p: Option<&Path>) -> Result<ListResult> {
            self.inner.list_with_delimiter(p).await
        }
        async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> Result<()> {
            self.inner.copy_opts(f, t, o).await
        }
    }

    fn flaky(n: usize, cut: usize) -> Arc<Flaky> {
        let s = Arc::new(Flaky {
            inner: InMemory::new(),
            cut: AtomicUsize::new(cut),
            gets: Arc::new(AtomicUsize::new(0)),
            ranged: AtomicUsize::new(0),
            down: false.into(),
            no_ranges: false.into(),
            paced: false.into(),
            hold: Arc::new(false.into()),
            bodies: Arc::new(AtomicUsize::new(0)),
            most: Arc::new(AtomicUsize::new(0)),
            log: Default::default(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for i in 0..n {
            let body: Vec<u8> = (0..1000 + i).map(|b| (b * 7 + i) as u8).collect();
            rt.block_on(s.put(
                &Path::from(format!("d/c{}/f{i:03}.bin", i % 2)),
                body.into(),
            ))
            .unwrap();
        }
        s
    }

    fn opts(dir: &std::path::Path) -> RemoteOptions {
        RemoteOptions {
            backoff: Duration::from_millis(1),
            ..RemoteOptions::new(dir.into())
        }
    }

    /// A [`Remote`] over `s3://b/d` in `store`, caching in `dir`.
    fn over(store: &Arc<Flaky>, dir: &std::path::Path) -> Remote {
        let url = RemoteUrl::parse("s3://b/d").unwrap();
        Remote::with_store(url, store.clone(), opts(dir)).unwrap()
    }

    fn expected(i: usize) -> Vec<u8> {
        (0..1000 + i).map(|b| (b * 7 + i) as u8).collect()
    }

    #[test]
    fn cut_bodies_are_retried_and_nothing_is_lost_or_doubled() {
        let store = flaky(12, 5);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        assert_eq!(r.objects().len(), 12);
        // Listed in folder-walk order: c0's files, then c1's.
        assert!(
            r.objects()[0].key.starts_with("d/c0/") && r.objects()[11].key.starts_with("d/c1/")
        );
        for (i, o) in r.objects().iter().enumerate() {
            let n: usize = o.key[6..9].parse().unwrap();
            assert_eq!(&r.read(i).unwrap()[..], &expected(n)[..], "{}", o.url);
        }
        let s = r.stats();
        assert_eq!(s.retries, 5);
        // Each cut body was asked again from where it stopped (the first
        // object's five times: 500 + 250 + 125 + 62 + 31 bytes, then the
        // rest): no byte came twice.
        assert_eq!(store.ranged.load(Ordering::SeqCst), 5);
        let total: u64 = r.total_bytes();
        assert_eq!(s.bytes_downloaded, total);
        assert_eq!(
            s.requests,
            1 + 12 + 5,
            "the listing, a GET per object, one per cut"
        );
        // A second pass is served from the cache: no new request.
        let gets = store.gets.load(Ordering::SeqCst);
        for i in 0..12 {
            r.read(i).unwrap();
        }
        assert_eq!(store.gets.load(Ordering::SeqCst), gets);
        // A new process (a new Remote over the same folder) downloads nothing.
        let url = RemoteUrl::parse("s3://b/d").unwrap();
        let again = Remote::with_store(url, store.clone(), opts(dir.path())).unwrap();
        for i in 0..12 {
            again.read(i).unwrap();
        }
        assert_eq!(store.gets.load(Ordering::SeqCst), gets);
        assert_eq!(again.stats().bytes_downloaded, 0);
        assert_eq!(again.stats().bytes_from_cache, total);
    }

    #[test]
    fn read_ahead_of_large_objects_starts_the_next_in_the_last_quarter() {
        // Three 1.25 MiB objects: `auto` starts large objects at one
        // download, and the next one begins while the last quarter of the
        // one before arrives (its time to first byte then overlaps that
        // one's end): the first body, held before its last fifth until
        // then, is still under way when the second starts.
        let store = flaky(0, 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let big = |i: usize| -> Vec<u8> { (0..(5 << 18)).map(|b| (b + i) as u8).collect() };
        for i in 0..3 {
            rt.block_on(store.put(&Path::from(format!("d/o{i}.bin")), big(i).into()))
                .unwrap();
        }
        store.paced.store(true, Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        r.schedule((0..3).collect(), None);
        let t = std::time::Instant::now();
        while r.stats().bytes_downloaded < r.total_bytes() && t.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(store.gets.load(Ordering::SeqCst), 3);
        assert!(store.most.load(Ordering::SeqCst) >= 2);
        for i in 0..3 {
            assert_eq!(&r.read(i).unwrap()[..], &big(i)[..]);
        }
    }

    #[test]
    fn a_stream_opened_during_the_read_ahead_reads_before_the_download_ends() {
        // The read-ahead downloads the object, whose body stops at its
        // half; the pipeline's stream, opened then, reads the bytes already
        // written from the temporary file while the download is held.
        let store = flaky(0, 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let big: Vec<u8> = (0..(5 << 18)).map(|b| (b * 3) as u8).collect();
        rt.block_on(store.put(&Path::from("d/o0.bin"), big.clone().into()))
            .unwrap();
        store.paced.store(true, Ordering::SeqCst);
        store.hold.store(true, Ordering::SeqCst);
        // (Not the first GET's wait for a second body.)
        store.most.store(2, Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        r.schedule(vec![0], None);
        let half = big.len() as u64 / 2;
        let t = std::time::Instant::now();
        while r.stats().bytes_downloaded < half && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let crate::ShardData::Stream(mut s) = r.open_stream(0).unwrap() else {
            panic!("the object is not in the cache yet");
        };
        let mut got = vec![0u8; (half - (64 << 10)) as usize];
        std::io::Read::read_exact(&mut s, &mut got).unwrap();
        assert!(
            r.stats().bytes_downloaded < big.len() as u64,
            "read only once the download ended"
        );
        store.hold.store(false, Ordering::SeqCst);
        std::io::Read::read_to_end(&mut s, &mut got).unwrap();
        assert_eq!(got, big);
    }

    #[test]
    fn a_store_that_refuses_ranges_gets_the_whole_object_again() {
        let store = flaky(3, 1);
        store.no_ranges.store(true, Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        assert_eq!(&r.read(0).unwrap()[..], &expected(0)[..]);
        // Cut, the ranged GET refused, then the whole object.
        assert_eq!(store.gets.load(Ordering::SeqCst), 3);
        assert_eq!(store.ranged.load(Ordering::SeqCst), 1);
        let s = r.stats();
        assert_eq!((s.retries, s.bytes_downloaded), (2, 500 + 1000));
    }

    #[test]
    fn a_dead_store_is_an_error_naming_the_url_after_the_retries() {
        let store = flaky(2, 0);
        store.down.store(true, Ordering::SeqCst);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        let e = r.read(0).unwrap_err().to_string();
        assert!(
            e.contains("s3://b/d/c0/f000.bin") && e.contains("after 6 attempt"),
            "{e}"
        );
        assert_eq!(store.gets.load(Ordering::SeqCst), 6);
        assert_eq!(r.stats().retries, 5);
    }

    #[test]
    fn an_empty_prefix_is_refused() {
        let store = flaky(2, 0);
        let dir = tempfile::tempdir().unwrap();
        let url = RemoteUrl::parse("s3://b/nothing-here").unwrap();
        let e = Remote::with_store(url, store, opts(dir.path())).unwrap_err();
        assert!(matches!(e, RemoteError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("s3://b/nothing-here"));
    }

    #[test]
    fn read_ahead_fills_the_cache_in_epoch_order_and_the_view_links_files() {
        let store = flaky(40, 0);
        let dir = tempfile::tempdir().unwrap();
        let r = over(&store, dir.path());
        let order: Vec<usize> = (0..40).rev().collect();
        r.schedule(order, None);
        let t = std::time::Instant::now();
        while store.gets.load(Ordering::SeqCst) < 40 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The queue runs ahead of the consumer by at most `ahead` objects
        // (here: all 40, the cache has no cap).
        assert_eq!(store.gets.load(Ordering::SeqCst), 40);
        assert_eq!(r.stats().bytes_downloaded, r.total_bytes());
        let view = r.materialize(&[0, 39]).unwrap();
        assert_eq!(
            store.gets.load(Ordering::SeqCst),
            40,
            "served from the cache"
        );
        assert!(view.paths()[0].ends_with("c0/f000.bin"));
        assert_eq!(std::fs::read(&view.paths()[1]).unwrap(), expected(39));
        let shown = view.to_url(&view.paths()[1].display().to_string());
        assert_eq!(shown, "s3://b/d/c1/f039.bin");
        let again = r.materialize(&[0, 39]).unwrap();
        assert_eq!(
            again.paths(),
            view.paths(),
            "one view per URL, the same every run"
        );
    }

    /// Reads epoch 0 (objects in order) with a 16 KiB cache cap over 40
    /// objects of ~1 KB, one read-ahead download at a time (so the GETs'
    /// order is the queue's), the next epoch's order the same; returns the
    /// GETs' object indices, in order, once there are `until` and no more
    /// come (and the cache's folder).
    fn epoch_with_next(
        prefetch: bool,
        until: usize,
    ) -> (Arc<Flaky>, Remote, Vec<usize>, tempfile::TempDir) {
        let store = flaky(40, 0);
        let dir = tempfile::tempdir().unwrap();
        let url = RemoteUrl::parse("s3://b/d").unwrap();
        let o = RemoteOptions {
            cache_bytes: Some(16 << 10),
            download_workers: Some(1),
            prefetch,
            ..opts(dir.path())
        };
        let r = Remote::with_store(url, store.clone(), o).unwrap();
        let order: Vec<usize> = (0..40).collect();
        r.schedule(order.clone(), Some(order.clone()));
        for &i in &order {
            r.read(i).unwrap();
        }
        // Until `until` GETs, then no more for 200 ms (10 s at most).
        let t = std::time::Instant::now();
        let mut last = (0, t);
        while (last.0 < until || last.1.elapsed() < Duration::from_millis(200))
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
            let now = store.gets.load(Ordering::SeqCst);
            if now != last.0 {
                last = (now, std::time::Instant::now());
            }
        }
        let index: std::collections::HashMap<&str, usize> = r
            .objects()
            .iter()
            .enumerate()
            .map(|(i, o)| (o.key.as_str(), i))
            .collect();
        let gets = store
            .log
            .lock()
            .unwrap()
            .iter()
            .map(|k| index[k.as_str()])
            .collect();
        (store, r, gets, dir)
    }

    #[test]
    fn the_next_epochs_first_objects_are_downloaded_after_this_epochs_within_the_cap() {
        let (store, r, gets, _dir) = epoch_with_next(true, 48);
        assert_eq!(gets.len(), 48, "{gets:?}");
        // Every object of this epoch once, before any of the next epoch's:
        // the next epoch's downloads never hold this one's back.
        let mut first: Vec<usize> = gets[..40].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..40).collect::<Vec<_>>());
        // Then the next epoch's first objects (evicted under the cap since
        // this epoch read them): as many as half the cache holds, 8 KiB
        // of objects of 1,019 bytes on average.
        let ahead = &gets[40..];
        let mut sorted = ahead.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>(), "{ahead:?}");
        assert!(r.cache().bytes() <= 16 << 10);
        // The next epoch finds them in the cache: no new request.
        for i in 0..8 {
            r.read(i).unwrap();
        }
        assert_eq!(store.gets.load(Ordering::SeqCst), 48);

        // Without prefetch nothing of the next epoch is downloaded early.
        let (store, r, gets, _dir) = epoch_with_next(false, 40);
        assert_eq!(gets.len(), 40, "{gets:?}");
        r.read(0).unwrap();
        assert_eq!(store.gets.load(Ordering::SeqCst), 41);
    }
}
