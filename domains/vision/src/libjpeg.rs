//! Region decoding through the system libjpeg(-turbo) (`csrc/ffjpeg.c`):
//! only the rows and iMCU columns a crop needs are decoded, optionally
//! scaled by `num/8` in the IDCT — libjpeg-turbo's `jpeg_crop_scanline`,
//! `jpeg_skip_scanlines` and scaled IDCTs (PIL's `draft()` uses the 1/2,
//! 1/4, 1/8 subset).
//!
//! Built only when the headers and library are present (see `build.rs`);
//! [`AVAILABLE`] says whether it was.
//!
//! ```
//! use ferrofeed_vision::libjpeg::Request;
//! let jpeg = ferrofeed_vision::synth::jpeg(2, 3, 90).unwrap();
//! if ferrofeed_vision::libjpeg::AVAILABLE {
//!     let (w, h) = ferrofeed_vision::libjpeg::header(&jpeg).unwrap().unwrap();
//!     // Half scale: the region (100, 50, 200×150) becomes (50, 25, 100×75).
//!     let r = ferrofeed_vision::libjpeg::decode_region(&jpeg, &Request::new(100, 50, 200, 150).scaled(4)).unwrap().unwrap();
//!     let i = r.info;
//!     assert!(i.x <= 50 && i.x + i.width >= 150 && i.y == 25 && i.height == 75);
//!     assert!(w > 0 && h > 0);
//! }
//! ```

/// Whether the libjpeg region decoder was built into this binary.
pub const AVAILABLE: bool = cfg!(ff_libjpeg);

/// A decoded region: where it sits, and its pixels.
#[derive(Debug, Clone)]
pub struct Region {
    /// Position, size and scale.
    pub info: RegionInfo,
    /// RGB rows of `info.width × 3` bytes.
    pub data: Vec<u8>,
}

#[cfg(ff_libjpeg)]
mod ffi {
    use std::os::raw::{c_char, c_int, c_uchar, c_ulong};
    extern "C" {
        pub(super) fn ff_jpeg_header(
            data: *const c_uchar,
            len: c_ulong,
            width: *mut c_int,
            height: *mut c_int,
            msg: *mut c_char,
            msg_cap: c_ulong,
        ) -> c_int;
        #[allow(clippy::too_many_arguments)]
        pub(super) fn ff_jpeg_decode_region(
            data: *const c_uchar,
            len: c_ulong,
            data2: *const c_uchar,
            len2: c_ulong,
            num: c_int,
            fast: c_int,
            x: c_int,
            y: c_int,
            w: c_int,
            h: c_int,
            out: *mut c_uchar,
            out_cap: c_ulong,
            out_x: *mut c_int,
            out_y: *mut c_int,
            out_w: *mut c_int,
            out_h: *mut c_int,
            msg: *mut c_char,
            msg_cap: c_ulong,
        ) -> c_int;
    }
}

#[cfg(ff_libjpeg)]
fn message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Image size from the header; `Ok(None)` when libjpeg cannot produce RGB
/// from it (CMYK/YCCK) or was not built.
pub fn header(bytes: &[u8]) -> Result<Option<(u32, u32)>, String> {
    #[cfg(ff_libjpeg)]
    {
        let (mut w, mut h) = (0, 0);
        let mut msg = [0u8; 256];
        // SAFETY: pointers to live buffers with their true lengths; the C
        // side never keeps them.
        let rc = unsafe {
            ffi::ff_jpeg_header(
                bytes.as_ptr(),
                bytes.len() as _,
                &mut w,
                &mut h,
                msg.as_mut_ptr().cast(),
                msg.len() as _,
            )
        };
        match rc {
            0 => Ok(Some((w as u32, h as u32))),
            2 => Ok(None),
            _ => Err(message(&msg)),
        }
    }
    #[cfg(not(ff_libjpeg))]
    {
        let _ = bytes;
        Ok(None)
    }
}

/// Where a decoded region sits, in scaled coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// First column (scaled; aligned down to an iMCU boundary).
    pub x: u32,
    /// First row (scaled).
    pub y: u32,
    /// Columns delivered.
    pub width: u32,
    /// Rows delivered.
    pub height: u32,
    /// The scale used, in eighths (8 = full size).
    pub num: u32,
}

/// What to decode: a rectangle of the full-resolution image, the IDCT
/// scale and the accuracy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// First column.
    pub x: u32,
    /// First row.
    pub y: u32,
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Scale in eighths, 1–8 (8 = full size, the default).
    pub num: u32,
    /// Fast integer IDCT and plain chroma upsampling: a little less
    /// accurate, faster (default off).
    pub fast: bool,
}

impl Request {
    /// The rectangle `(x, y, width × height)` at full size, accurate.
    pub fn new(x: u32, y: u32, width: u32, height: u32) -> Self {
        Request {
            x,
            y,
            width,
            height,
            num: 8,
            fast: false,
        }
    }

    /// The same rectangle at `num/8` scale.
    pub fn scaled(self, num: u32) -> Self {
        Request { num, ..self }
    }

    /// The same rectangle with the fast IDCT or not.
    pub fn fast(self, fast: bool) -> Self {
        Request { fast, ..self }
    }
}

/// Decodes `req`; `Ok(None)` when libjpeg cannot produce RGB (CMYK/YCCK)
/// or was not built.
pub fn decode_region(bytes: &[u8], req: &Request) -> Result<Option<Region>, String> {
    let mut buf = Vec::new();
    Ok(decode_region_into(bytes, req, &mut buf)?.map(|info| {
        buf.truncate(info.width as usize * info.height as usize * 3);
        Region { info, data: buf }
    }))
}

/// Like [`decode_region`], writing the RGB rows into `buf` (grown when too
/// small, never shrunk, so a reused buffer costs no allocation); the pixels
/// are `buf[..width * height * 3]`.
pub fn decode_region_into(
    bytes: &[u8],
    req: &Request,
    buf: &mut Vec<u8>,
) -> Result<Option<RegionInfo>, String> {
    decode_spliced_into(bytes, &[], req, buf)
}

/// Like [`decode_region_into`] for a JPEG stream stored in two pieces,
/// `head` then `rest`: a stand-in made by [`crate::jpeg::Layout::splice`]
/// and the rest of the file, or one made by [`crate::jpeg::Layout::crop`]
/// with `rest` empty.
pub fn decode_spliced_into(
    head: &[u8],
    rest: &[u8],
    req: &Request,
    buf: &mut Vec<u8>,
) -> Result<Option<RegionInfo>, String> {
    #[cfg(ff_libjpeg)]
    {
        let Request {
            x,
            y,
            width: w,
            height: h,
            num,
            fast,
        } = *req;
        if !(1..=8).contains(&num) {
            return Err(format!("scale {num}/8 is not supported"));
        }
        let sw = (w as usize * num as usize).div_ceil(8) + 2;
        let sh = (h as usize * num as usize).div_ceil(8) + 2;
        // iMCU alignment widens the region by at most 32 columns each side.
        let cap = (sw + 64) * sh * 3;
        if buf.len() < cap {
            buf.resize(cap, 0);
        }
        let (mut ox, mut oy, mut ow, mut oh) = (0, 0, 0, 0);
        let mut msg = [0u8; 256];
        let to_int = |v: u32| i32::try_from(v).map_err(|_| format!("coordinate {v} is too large"));
        // SAFETY: pointers to live buffers with their true lengths; `buf`
        // has `buf.len()` writable bytes and the C side checks its writes
        // against that; nothing is kept after the call.
        let rc = unsafe {
            ffi::ff_jpeg_decode_region(
                head.as_ptr(),
                head.len() as _,
                rest.as_ptr(),
                rest.len() as _,
                num as i32,
                i32::from(fast),
                to_int(x)?,
                to_int(y)?,
                to_int(w)?,
                to_int(h)?,
                buf.as_mut_ptr(),
                buf.len() as _,
                &mut ox,
                &mut oy,
                &mut ow,
                &mut oh,
                msg.as_mut_ptr().cast(),
                msg.len() as _,
            )
        };
        match rc {
            0 => Ok(Some(RegionInfo {
                x: ox as u32,
                y: oy as u32,
                width: ow as u32,
                height: oh as u32,
                num,
            })),
            2 => Ok(None),
            _ => Err(message(&msg)),
        }
    }
    #[cfg(not(ff_libjpeg))]
    {
        let _ = (head, rest, req, buf);
        Ok(None)
    }
}
