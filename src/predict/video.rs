//! Videos for `predict`: MP4 / MOV / M4V files holding H.264 video are read frame by frame, and
//! the annotated frames are written as an H.264 MP4. The container is read and written by the
//! `mp4` crate, the video coded by OpenH264 (the `openh264` crate builds it from its bundled
//! source, so nothing beyond a C++ compiler is needed; docs/dependencies.md). Other video
//! formats are refused by name.
//!
//! H.264 carries pictures of even width and height in 4:2:0; a frame of odd size is written with
//! its last column or row repeated. Frames are numbered from 1 and timed from 0 at the track's
//! mean frame rate, as Ultralytics numbers the frames of its label files (`<stem>_<frame>.txt`).

use image::RgbImage;
use mp4::{AvcConfig, MediaConfig, MediaType, Mp4Config, Mp4Reader, Mp4Sample, Mp4Writer};
use openh264::OpenH264API;
use openh264::decoder::{Decoder, DecoderConfig};
use openh264::encoder::{
    BitRate, Complexity, Encoder, EncoderConfig, FrameRate, FrameType, RateControlMode,
};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264_sys2::{DECODER_OPTION_NUM_OF_FRAMES_REMAINING_IN_BUFFER, SBufferInfo, dsErrorFree};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

/// Extensions read as MP4-family containers (ISO base media files).
pub const READ: [&str; 3] = ["mp4", "m4v", "mov"];
/// Ultralytics' other video extensions: named and skipped, as this build cannot read them.
pub const REFUSED: [&str; 9] = [
    "asf", "avi", "gif", "mkv", "mpeg", "mpg", "ts", "wmv", "webm",
];

/// Frame rate of a track that does not state a usable one.
const DEFAULT_FPS: f64 = 30.0;

/// Whether `path` names a video by its extension (one this build reads or not).
pub fn is_video(path: &Path) -> bool {
    extension(path).is_some_and(|e| READ.contains(&e.as_str()) || REFUSED.contains(&e.as_str()))
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
}

#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error("{}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Write { path: PathBuf, message: String },
}

fn read_error(path: &Path, message: impl std::fmt::Display) -> VideoError {
    VideoError::Read {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn write_error(path: &Path, message: impl std::fmt::Display) -> VideoError {
    VideoError::Write {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// One decoded frame.
pub struct VideoFrame {
    /// From 1, in display order.
    pub frame: u64,
    /// Seconds from the first frame.
    pub time: f64,
    pub image: RgbImage,
}

/// The frames of one video file, decoded one sample at a time (memory does not grow with the
/// video's length).
pub struct VideoReader {
    path: PathBuf,
    mp4: Mp4Reader<BufReader<File>>,
    track: u32,
    samples: u32,
    next_sample: u32,
    /// The track's NAL length size and its parameter sets, put before each key frame.
    length_size: usize,
    parameter_sets: Vec<u8>,
    decoder: Decoder,
    decoded: VecDeque<RgbImage>,
    flushed: bool,
    fps: f64,
    frames_out: u64,
}

impl VideoReader {
    /// Opens `path` and finds its H.264 track; any other content is an error naming the file.
    pub fn open(path: &Path) -> Result<Self, VideoError> {
        let ext = extension(path).unwrap_or_default();
        if !READ.contains(&ext.as_str()) {
            return Err(read_error(
                path,
                format!(
                    "video format .{ext} is not read by this build (MP4, MOV or M4V with H.264 \
                     video: {})",
                    READ.join(", ")
                ),
            ));
        }
        let file = File::open(path).map_err(|e| read_error(path, e))?;
        let size = file.metadata().map_err(|e| read_error(path, e))?.len();
        // The container parser indexes into what the file claims; a damaged file must be an
        // error, not a crash.
        let parsed =
            std::panic::catch_unwind(|| Mp4Reader::read_header(BufReader::new(file), size))
                .map_err(|_| read_error(path, "not a readable MP4 file (damaged container)"))?;
        let mp4 = parsed.map_err(|e| read_error(path, format!("not a readable MP4 file ({e})")))?;
        let mut tracks: Vec<_> = mp4.tracks().iter().collect();
        tracks.sort_by_key(|(id, _)| **id);
        let (&track, t) = tracks
            .into_iter()
            .find(|(_, t)| matches!(t.media_type(), Ok(MediaType::H264)))
            .ok_or_else(|| {
                read_error(
                    path,
                    "no H.264 video track (the only video this build decodes)",
                )
            })?;
        let avcc = &t
            .trak
            .mdia
            .minf
            .stbl
            .stsd
            .avc1
            .as_ref()
            .expect("an H.264 track has an avc1 entry")
            .avcc;
        let mut parameter_sets = Vec::new();
        for set in avcc
            .sequence_parameter_sets
            .iter()
            .chain(&avcc.picture_parameter_sets)
        {
            parameter_sets.extend([0, 0, 0, 1]);
            parameter_sets.extend(&set.bytes);
        }
        let fps = t.frame_rate();
        let decoder = Decoder::with_api_config(OpenH264API::from_source(), DecoderConfig::new())
            .map_err(|e| read_error(path, format!("cannot start the H.264 decoder ({e})")))?;
        Ok(Self {
            path: path.to_path_buf(),
            samples: t.sample_count(),
            length_size: avcc.length_size_minus_one as usize % 4 + 1,
            mp4,
            track,
            next_sample: 1,
            parameter_sets,
            decoder,
            decoded: VecDeque::new(),
            flushed: false,
            fps: if fps.is_finite() && fps > 0.0 {
                fps
            } else {
                DEFAULT_FPS
            },
            frames_out: 0,
        })
    }

    /// Frames the container lists (what a progress bar counts to).
    pub fn frame_count(&self) -> u64 {
        self.samples as u64
    }

    /// The track's mean frame rate (30 where it states none).
    pub fn fps(&self) -> f64 {
        self.fps
    }

    /// The next frame; `None` at the end. After an error the reader is done.
    fn next_frame(&mut self) -> Result<Option<VideoFrame>, VideoError> {
        while self.decoded.is_empty() {
            if self.next_sample > self.samples {
                if self.flushed {
                    return Ok(None);
                }
                self.flushed = true;
                let rest = self
                    .flush()
                    .map_err(|m| read_error(&self.path, format!("H.264 decoding failed ({m})")))?;
                self.decoded.extend(rest);
                continue;
            }
            let i = self.next_sample;
            self.next_sample += 1;
            let sample = self
                .mp4
                .read_sample(self.track, i)
                .map_err(|e| read_error(&self.path, format!("sample {i}: {e}")))?;
            let Some(sample) = sample else { continue };
            let mut packet = Vec::with_capacity(sample.bytes.len() + self.parameter_sets.len());
            if sample.is_sync {
                packet.extend(&self.parameter_sets);
            }
            annex_b(&sample.bytes, self.length_size, &mut packet)
                .map_err(|m| read_error(&self.path, format!("sample {i}: {m}")))?;
            // The access unit, then an empty call that hands out a picture finished by it, as
            // OpenH264's own decoder program does with `DecodeFrame2`.
            for input in [&packet[..], &[]] {
                let frame = self.decode(input).map_err(|m| {
                    read_error(
                        &self.path,
                        format!("sample {i}: H.264 decoding failed ({m})"),
                    )
                })?;
                self.decoded.extend(frame);
            }
        }
        let image = self.decoded.pop_front().expect("checked above");
        self.frames_out += 1;
        Ok(Some(VideoFrame {
            frame: self.frames_out,
            time: (self.frames_out - 1) as f64 / self.fps,
            image,
        }))
    }
}

impl VideoReader {
    /// One access unit in (or none: the decoder's "hand out what you have"), at most one picture
    /// out, in display order. Through OpenH264's
    /// `DecodeFrame2`: the crate's safe `decode` calls `DecodeFrameNoDelay`, which fails on
    /// streams with B-frames (openh264-rs issue 50), the usual output of x264 and cameras.
    fn decode(&mut self, packet: &[u8]) -> Result<Option<RgbImage>, String> {
        let mut planes = [std::ptr::null_mut::<u8>(); 3];
        let mut info = SBufferInfo::default();
        // SAFETY: the decoder is initialised; `packet` outlives the call; OpenH264 writes at most
        // three plane pointers and one info record, both ours.
        let source = match packet.is_empty() {
            true => std::ptr::null(),
            false => packet.as_ptr(),
        };
        let state = unsafe {
            self.decoder.raw_api().decode_frame2(
                source,
                packet.len() as i32,
                planes.as_mut_ptr(),
                &mut info,
            )
        };
        if state != dsErrorFree {
            return Err(format!("decoding state {state:#x}"));
        }
        // SAFETY: the planes are valid until the decoder's next call, and are read now.
        Ok(unsafe { picture(&planes, &info) })
    }

    /// The pictures the decoder still holds back for reordering, at the end of the stream.
    fn flush(&mut self) -> Result<Vec<RgbImage>, String> {
        let mut left: i32 = 0;
        // SAFETY: an int-sized option read into an int.
        let got = unsafe {
            self.decoder.raw_api().get_option(
                DECODER_OPTION_NUM_OF_FRAMES_REMAINING_IN_BUFFER,
                (&raw mut left).cast(),
            )
        };
        if got != 0 {
            return Err(format!("cannot count the frames left (error {got})"));
        }
        let mut out = Vec::new();
        for _ in 0..left {
            let mut planes = [std::ptr::null_mut::<u8>(); 3];
            let mut info = SBufferInfo::default();
            // SAFETY: as in `decode`.
            let state = unsafe {
                self.decoder
                    .raw_api()
                    .flush_frame(planes.as_mut_ptr(), &mut info)
            };
            if state != dsErrorFree {
                return Err(format!("flushing: decoding state {state:#x}"));
            }
            // SAFETY: as in `decode`.
            out.extend(unsafe { picture(&planes, &info) });
        }
        Ok(out)
    }
}

/// The decoded I420 picture the decoder points at, as RGB (BT.601, video range, as OpenH264's
/// Rust crate converts): `None` when it holds none.
///
/// # Safety
/// `planes` and `info` come from the decoder's last call, with nothing called since.
unsafe fn picture(planes: &[*mut u8; 3], info: &SBufferInfo) -> Option<RgbImage> {
    if info.iBufferStatus != 1 || planes.iter().any(|p| p.is_null()) {
        return None;
    }
    // SAFETY: the union member the decoder fills for system-memory output.
    let buffer = unsafe { info.UsrData.sSystemBuffer };
    let (w, h) = (buffer.iWidth as usize, buffer.iHeight as usize);
    let (sy, suv) = (buffer.iStride[0] as usize, buffer.iStride[1] as usize);
    if w == 0 || h == 0 || sy < w || suv < w.div_ceil(2) {
        return None;
    }
    // SAFETY: the decoder's planes hold `h` rows of `sy` and ⌈h/2⌉ rows of `suv` bytes.
    let (y, u, v) = unsafe {
        (
            std::slice::from_raw_parts(planes[0], sy * h),
            std::slice::from_raw_parts(planes[1], suv * h.div_ceil(2)),
            std::slice::from_raw_parts(planes[2], suv * h.div_ceil(2)),
        )
    };
    let mut rgb = vec![0u8; w * h * 3];
    for row in 0..h {
        let (yr, cr) = (&y[row * sy..], row / 2 * suv);
        for col in 0..w {
            let l = 255.0 / 219.0 * (yr[col] as f32 - 16.0);
            let cb = u[cr + col / 2] as f32 - 128.0;
            let cr_ = v[cr + col / 2] as f32 - 128.0;
            let px = &mut rgb[(row * w + col) * 3..][..3];
            px[0] = (l + 255.0 / 224.0 * 1.402 * cr_).round().clamp(0.0, 255.0) as u8;
            px[1] = (l - 255.0 / 224.0 * (1.402 * 0.299 / 0.587 * cr_ + 1.772 * 0.114 / 0.587 * cb))
                .round()
                .clamp(0.0, 255.0) as u8;
            px[2] = (l + 255.0 / 224.0 * 1.772 * cb).round().clamp(0.0, 255.0) as u8;
        }
    }
    RgbImage::from_raw(w as u32, h as u32, rgb)
}

impl Iterator for VideoReader {
    type Item = Result<VideoFrame, VideoError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_frame() {
            Ok(f) => f.map(Ok),
            Err(e) => {
                // Nothing after an error: the caller keeps the frames it has.
                self.next_sample = self.samples + 1;
                self.flushed = true;
                self.decoded.clear();
                Some(Err(e))
            }
        }
    }
}

/// MP4's length-prefixed NAL units as the start-code stream the decoder reads.
fn annex_b(mut sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> Result<(), String> {
    while !sample.is_empty() {
        if sample.len() < length_size {
            return Err("truncated NAL length".into());
        }
        let n = sample[..length_size]
            .iter()
            .fold(0usize, |n, &b| (n << 8) | b as usize);
        sample = &sample[length_size..];
        if n > sample.len() {
            return Err(format!("NAL unit of {n} bytes past the sample's end"));
        }
        out.extend([0, 0, 0, 1]);
        out.extend(&sample[..n]);
        sample = &sample[n..];
    }
    Ok(())
}

/// The annotated frames of one video as an H.264 MP4, written as they come; [`VideoWriter::finish`]
/// writes the index that makes the file playable.
pub struct VideoWriter {
    path: PathBuf,
    file: Option<Mp4Writer<BufWriter<File>>>,
    encoder: Encoder,
    /// The coded size: the frames' size rounded up to even.
    width: u32,
    height: u32,
    /// Track ticks per second and per frame.
    timescale: u32,
    ticks: u32,
    frames: u64,
}

impl VideoWriter {
    /// A writer of `width`×`height` frames at `fps` into `path` (created, or replaced).
    pub fn create(path: &Path, width: u32, height: u32, fps: f64) -> Result<Self, VideoError> {
        let (width, height) = (
            width.max(2).next_multiple_of(2),
            height.max(2).next_multiple_of(2),
        );
        let fps = if fps.is_finite() && fps > 0.0 {
            fps
        } else {
            DEFAULT_FPS
        };
        // ~0.15 bits per pixel and frame: annotation lines stay sharp at the usual sizes.
        let bps = (0.15 * width as f64 * height as f64 * fps).clamp(500e3, 50e6) as u32;
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(bps))
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            .rate_control_mode(RateControlMode::Bitrate)
            .complexity(Complexity::Low)
            // Every frame is written: a skipped frame would shift the video against the JSON.
            .skip_frames(false);
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| write_error(path, format!("cannot start the H.264 encoder ({e})")))?;
        let timescale = 90_000;
        let ticks = (timescale as f64 / fps).round().max(1.0) as u32;
        let out = File::create(path).map_err(|e| write_error(path, e))?;
        let brands = ["isom", "iso2", "avc1", "mp41"];
        let config = Mp4Config {
            major_brand: "isom".parse().expect("a four-character code"),
            minor_version: 512,
            compatible_brands: brands
                .iter()
                .map(|b| b.parse().expect("a four-character code"))
                .collect(),
            timescale: 1000,
        };
        let file = Mp4Writer::write_start(BufWriter::new(out), &config)
            .map_err(|e| write_error(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Some(file),
            encoder,
            width,
            height,
            timescale,
            ticks,
            frames: 0,
        })
    }

    /// Encodes and appends one frame (of the size given to [`VideoWriter::create`]).
    pub fn write(&mut self, image: &RgbImage) -> Result<(), VideoError> {
        let frame = coded(image, self.size()).map_err(|m| write_error(&self.path, m))?;
        self.write_coded(&frame)
    }

    /// The coded (even) size, what [`coded`] takes.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Encodes and appends one frame made by [`coded`] for this video's size.
    pub fn write_coded(&mut self, frame: &Coded) -> Result<(), VideoError> {
        let stream = self
            .encoder
            .encode(&frame.0)
            .map_err(|e| write_error(&self.path, format!("H.264 encoding failed ({e})")))?;
        let is_sync = matches!(stream.frame_type(), FrameType::IDR | FrameType::I);
        let (mut sps, mut pps, mut bytes) = (None, None, Vec::new());
        for l in 0..stream.num_layers() {
            let layer = stream.layer(l).expect("a layer below num_layers");
            for n in 0..layer.nal_count() {
                let nal = strip_start_code(layer.nal_unit(n).expect("a unit below nal_count"));
                match nal.first().map(|b| b & 0x1f) {
                    Some(7) => sps = Some(nal.to_vec()),
                    Some(8) => pps = Some(nal.to_vec()),
                    Some(_) => {
                        bytes.extend((nal.len() as u32).to_be_bytes());
                        bytes.extend(nal);
                    }
                    None => {}
                }
            }
        }
        let file = self.file.as_mut().expect("open until finish");
        if self.frames == 0 {
            let (Some(seq_param_set), Some(pic_param_set)) = (sps, pps) else {
                return Err(write_error(
                    &self.path,
                    "the encoder's first frame has no parameter sets",
                ));
            };
            let track = mp4::TrackConfig {
                track_type: mp4::TrackType::Video,
                timescale: self.timescale,
                language: "und".into(),
                media_conf: MediaConfig::AvcConfig(AvcConfig {
                    width: self.width as u16,
                    height: self.height as u16,
                    seq_param_set,
                    pic_param_set,
                }),
            };
            file.add_track(&track)
                .map_err(|e| write_error(&self.path, e))?;
        }
        let sample = Mp4Sample {
            start_time: self.frames * self.ticks as u64,
            duration: self.ticks,
            rendering_offset: 0,
            is_sync,
            bytes: bytes.into(),
        };
        file.write_sample(1, &sample)
            .map_err(|e| write_error(&self.path, e))?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Writes the container's index and flushes the file.
    pub fn finish(mut self) -> Result<(), VideoError> {
        let mut file = self.file.take().expect("open until finish");
        file.write_end().map_err(|e| write_error(&self.path, e))?;
        let out = file.into_writer();
        out.into_inner()
            .map_err(|e| write_error(&self.path, e.into_error()))?
            .sync_all()
            .map_err(|e| write_error(&self.path, e))
    }
}

/// A frame as the encoder takes it (I420 at the video's coded size).
pub struct Coded(YUVBuffer);

/// `image` as a frame of a video of coded size `(w, h)`: copied into the even-sized frame (the
/// last column and row repeated where it is larger) and converted to I420. Independent of the
/// writer, so frames can be converted in parallel and encoded in order
/// ([`VideoWriter::write_coded`]).
pub fn coded(image: &RgbImage, (w, h): (u32, u32)) -> Result<Coded, String> {
    let (w, h) = (w as usize, h as usize);
    let (iw, ih) = (image.width() as usize, image.height() as usize);
    if iw == 0 || ih == 0 || iw > w || ih > h {
        return Err(format!("frame of {iw}×{ih} in a video of {w}×{h}"));
    }
    let raw = image.as_raw();
    let mut rgb = vec![0u8; w * h * 3];
    for y in 0..h {
        let src = &raw[y.min(ih - 1) * iw * 3..][..iw * 3];
        let dst = &mut rgb[y * w * 3..][..w * 3];
        dst[..iw * 3].copy_from_slice(src);
        for x in iw..w {
            dst.copy_within((iw - 1) * 3..iw * 3, x * 3);
        }
    }
    Ok(Coded(YUVBuffer::from_rgb_source(RgbSliceU8::new(
        &rgb,
        (w, h),
    ))))
}

/// A NAL unit without its Annex B start code.
fn strip_start_code(nal: &[u8]) -> &[u8] {
    if nal.starts_with(&[0, 0, 0, 1]) {
        &nal[4..]
    } else if nal.starts_with(&[0, 0, 1]) {
        &nal[3..]
    } else {
        nal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A moving gradient with a square: enough structure for the codec to work on.
    fn frame(w: u32, h: u32, t: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| {
            let inside = (x + 3 * t) % w < w / 3 && y > h / 4 && y < h / 2;
            if inside {
                image::Rgb([250, 40, 40])
            } else {
                image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, 128])
            }
        })
    }

    fn psnr(a: &RgbImage, b: &RgbImage) -> f64 {
        let n = a.as_raw().len() as f64;
        let se: f64 = a
            .as_raw()
            .iter()
            .zip(b.as_raw())
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
            .sum();
        10.0 * (255.0f64.powi(2) / (se / n).max(1e-12)).log10()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("burnpose-video-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn frames_written_read_back_in_order_and_close_to_the_source() {
        let dir = scratch("roundtrip");
        for (w, h) in [(96u32, 64u32), (75, 41)] {
            let path = dir.join(format!("clip{w}.mp4"));
            let mut writer = VideoWriter::create(&path, w, h, 12.0).unwrap();
            let sources: Vec<RgbImage> = (0..7).map(|t| frame(w, h, t)).collect();
            for f in &sources {
                writer.write(f).unwrap();
            }
            assert_eq!(writer.frames(), 7);
            writer.finish().unwrap();
            let reader = VideoReader::open(&path).unwrap();
            assert_eq!(reader.frame_count(), 7);
            assert!((reader.fps() - 12.0).abs() < 1e-6, "fps {}", reader.fps());
            let frames: Vec<VideoFrame> = reader.map(Result::unwrap).collect();
            assert_eq!(frames.len(), 7);
            let (ew, eh) = (w.next_multiple_of(2), h.next_multiple_of(2));
            for (i, (f, src)) in frames.iter().zip(&sources).enumerate() {
                assert_eq!(f.frame, i as u64 + 1);
                assert!((f.time - i as f64 / 12.0).abs() < 1e-9);
                assert_eq!(f.image.dimensions(), (ew, eh));
                let cropped = image::imageops::crop_imm(&f.image, 0, 0, w, h).to_image();
                let p = psnr(&cropped, src);
                // 4:2:0 halves the colour resolution at the red square's edges (~28 dB at the
                // odd size); each frame must also be its own source's, not a neighbour's (the
                // square moves 3 px a frame).
                assert!(p > 26.0, "{w}×{h} frame {i}: PSNR {p:.1} dB");
                for (j, other) in sources.iter().enumerate().filter(|(j, _)| *j != i) {
                    assert!(
                        psnr(&cropped, other) < p,
                        "frame {i} is closer to source {j}"
                    );
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_and_foreign_files_are_errors_naming_the_file() {
        let dir = scratch("damaged");
        let good = dir.join("good.mp4");
        let mut writer = VideoWriter::create(&good, 64, 48, 10.0).unwrap();
        for t in 0..4 {
            writer.write(&frame(64, 48, t)).unwrap();
        }
        writer.finish().unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let cases: [(&str, Vec<u8>); 3] = [
            (
                "noise.mp4",
                (0..4000u32).map(|i| (i * 7919 % 251) as u8).collect(),
            ),
            ("truncated.mp4", bytes[..bytes.len() / 2].to_vec()),
            ("empty.mov", Vec::new()),
        ];
        for (name, content) in cases {
            let path = dir.join(name);
            std::fs::write(&path, content).unwrap();
            let message = match VideoReader::open(&path) {
                Err(e) => e.to_string(),
                // A header that parses: the damage must show as a frame error, not a panic.
                Ok(r) => match r.collect::<Result<Vec<_>, _>>() {
                    Err(e) => e.to_string(),
                    Ok(frames) => panic!("{name}: {} frames from a damaged file", frames.len()),
                },
            };
            assert!(message.contains(name), "{message}");
        }
        // An MP4 without H.264: an audio-only file.
        let audio = dir.join("audio.mp4");
        let config = Mp4Config {
            major_brand: "isom".parse().unwrap(),
            minor_version: 512,
            compatible_brands: vec!["isom".parse().unwrap()],
            timescale: 1000,
        };
        let mut w = Mp4Writer::write_start(File::create(&audio).unwrap(), &config).unwrap();
        w.add_track(&mp4::TrackConfig {
            track_type: mp4::TrackType::Audio,
            timescale: 44_100,
            language: "und".into(),
            media_conf: MediaConfig::AacConfig(mp4::AacConfig::default()),
        })
        .unwrap();
        w.write_end().unwrap();
        let e = VideoReader::open(&audio).err().unwrap().to_string();
        assert!(
            e.contains("audio.mp4") && e.contains("no H.264 video track"),
            "{e}"
        );

        let avi = dir.join("clip.avi");
        std::fs::write(&avi, b"RIFF").unwrap();
        assert!(is_video(&avi));
        let e = VideoReader::open(&avi).err().unwrap().to_string();
        assert!(
            e.contains("clip.avi") && e.contains(".avi is not read"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
