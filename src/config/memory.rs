//! corral's memory keys: `devices`, `loadBandwidth`, `loadStallTimeout` at the top, and `memory`
//! and `loadTimeout` per model.

use std::time::Duration;

use super::read::MapReader;
use super::yaml::{Node, Value};
use super::ConfigError;
use crate::gpu::Gpu;
pub use crate::gpu::Vendor;
use crate::memory::{parse_bytes, parse_params, DEFAULT_LOAD_BANDWIDTH};

/// A GPU (or any device) memory budget, and how an engine is told to use it.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub name: String,
    pub capacity: u64,
    /// Kept free for the driver, other programs and fragmentation.
    pub reserve: u64,
    /// Whose device selection variable pins an engine to it (none: it is not pinned).
    pub vendor: Vendor,
    /// What corral knows it by: its UUID where known, else its index. Per-process memory readings
    /// (NVML, `nvidia-smi --query-compute-apps=gpu_uuid`, rocm-smi) name a device so, and an
    /// engine is pinned by it, save an NVIDIA engine shown the index (see [`Device::index`]).
    pub select_as: Option<String>,
    /// Its number as the vendor's tool counts (nvidia-smi's index, which is PCI bus order), where
    /// known: what an NVIDIA engine is shown it by when CUDA is told to number devices in bus
    /// order too, since vLLM takes no UUID in `CUDA_VISIBLE_DEVICES`.
    pub index: Option<u32>,
}

impl Device {
    /// The budget for a GPU `devices: auto` found: named and pinned as its vendor selects it, with
    /// 5% kept in reserve.
    pub fn of_gpu(gpu: &Gpu) -> Device {
        Device {
            name: gpu.name(),
            capacity: gpu.total,
            reserve: gpu.total / 20,
            vendor: gpu.vendor,
            select_as: Some(gpu.selector()),
            index: Some(gpu.index),
        }
    }
}

/// The number a device name ends with (`cuda1` is 1).
fn trailing_index(name: &str) -> Option<String> {
    let digits = &name[name.trim_end_matches(|c: char| c.is_ascii_digit()).len()..];
    (!digits.is_empty()).then(|| digits.to_string())
}

impl Device {
    pub fn usable(&self) -> u64 {
        self.capacity.saturating_sub(self.reserve)
    }
}

/// A model's `memory:` key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemorySpec {
    /// An explicit size; overrides every estimate.
    pub bytes: Option<u64>,
    /// Parameters and quantization, for engines without a GGUF file.
    pub params: Option<u64>,
    pub quant: Option<String>,
    /// KV cache to add to a parameter-based estimate.
    pub kv_bytes: u64,
    /// Host memory it holds while it runs (weights or KV kept on the CPU); overrides the
    /// estimate's.
    pub host: Option<u64>,
    /// Devices the model must use (split evenly across them); empty means any one device.
    pub devices: Vec<String>,
    /// `placement: pack`: put it on the fullest device it fits on, keeping whole devices free for
    /// big models; the default (`spread`) takes the one with the most room, so replicas spread.
    pub pack: bool,
}

pub(super) fn bytes_value(r: &MapReader<'_>, key: &str) -> Result<Option<u64>, ConfigError> {
    match r.get(key).map(|n| &n.value) {
        None => Ok(None),
        Some(Value::Int(i)) if *i >= 0 => Ok(Some(*i as u64)),
        Some(Value::Str(s)) => parse_bytes(s).map(Some).map_err(|e| r.err(key, e)),
        Some(_) => Err(r.err(key, "must be a size such as 24GiB or a number of bytes")),
    }
}

pub fn devices(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Device>, ConfigError> {
    let Some(node) = top.get("devices") else {
        return Ok(Vec::new());
    };
    if let Value::Str(s) = &node.value {
        if s == "auto" {
            return Ok(auto_devices(warnings));
        }
        return Err(top.err("devices", "must be a list of devices or auto"));
    }
    let Value::Seq(items) = &node.value else {
        return Err(top.err("devices", "must be a list of devices or auto"));
    };
    let mut out: Vec<Device> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        out.push(list_entry(i, item, &out, warnings)?);
    }
    Ok(out)
}

/// Entry `i` of the `devices:` list, named `gpu<i>` unless it says, and not named as one of
/// the entries before it.
fn list_entry(
    i: usize,
    item: &Node,
    before: &[Device],
    warnings: &mut Vec<String>,
) -> Result<Device, ConfigError> {
    let d = MapReader::new(
        item,
        &format!("devices[{i}]"),
        &["name", "capacity", "reserve", "vendor", "index", "uuid"],
        warnings,
    )?;
    let name = d.string("name")?.unwrap_or_else(|| format!("gpu{i}"));
    if before.iter().any(|o| o.name == name) {
        return Err(d.err("name", format!("device {name:?} is listed twice")));
    }
    device(&d, name)
}

/// One entry of a `devices:` list, its name already read: its memory budget and how an engine
/// is pinned to it.
fn device(d: &MapReader<'_>, name: String) -> Result<Device, ConfigError> {
    let capacity = bytes_value(d, "capacity")?
        .ok_or_else(|| d.err("capacity", "a device needs a capacity, such as 24GiB"))?;
    let reserve = bytes_value(d, "reserve")?.unwrap_or(0);
    if reserve >= capacity {
        return Err(d.err("reserve", "must be less than the capacity"));
    }
    let (vendor, select_as, index) = pinning(d, &name)?;
    Ok(Device {
        name,
        capacity,
        reserve,
        vendor,
        select_as,
        index,
    })
}

/// A device's vendor, what corral knows it by (`uuid`, else `index`, else the number its name
/// ends with; a pinned device must have one of them) and its index where the config gives one.
/// A name's number counts as the index only when no `uuid` names the device, so that a `uuid`
/// written alone still pins by that UUID.
fn pinning(
    d: &MapReader<'_>,
    name: &str,
) -> Result<(Vendor, Option<String>, Option<u32>), ConfigError> {
    let uuid = d.string("uuid")?;
    let index = match d.int("index")? {
        Some(i) if i >= 0 => Some(i.to_string()),
        Some(_) => return Err(d.err("index", "must be 0 or more")),
        None if uuid.is_none() => trailing_index(name),
        None => None,
    };
    let number = index.as_deref().and_then(|i| i.parse().ok());
    let select_as = uuid.or(index);
    let vendor = vendor(d, name, select_as.is_some())?;
    if vendor != Vendor::None && select_as.is_none() {
        return Err(d.err(
            "index",
            format!("{name} needs an index or a uuid to be pinned"),
        ));
    }
    Ok((vendor, select_as, number))
}

/// A device's `vendor`; unless given, the one its name says when it is pinned (`cuda0`), and
/// none (budgeted only) when it is not.
fn vendor(d: &MapReader<'_>, name: &str, pinned: bool) -> Result<Vendor, ConfigError> {
    match d.string("vendor")? {
        None if pinned => Ok(Vendor::from_name(name)),
        None => Ok(Vendor::None),
        Some(v) => Vendor::parse(&v).ok_or_else(|| {
            d.err(
                "vendor",
                format!("must be nvidia, amd, intel, vulkan or none, not {v:?}"),
            )
        }),
    }
}

/// `devices: auto`: every NVIDIA GPU (NVML, else nvidia-smi), else every AMD one (rocm-smi),
/// each with 5% kept in reserve.
fn auto_devices(warnings: &mut Vec<String>) -> Vec<Device> {
    let found: Vec<Device> = crate::gpu::discover().iter().map(Device::of_gpu).collect();
    if found.is_empty() {
        warnings.push(
            "devices: auto found no GPU (NVML, nvidia-smi, rocm-smi); placing by memory is off"
                .into(),
        );
    }
    found
}

/// `deviceRefresh`: seconds between readings of what other programs use on the GPUs, 5 unless
/// set, 0 for never. Only devices found by `devices: auto` are read (their vendor's tool names
/// them).
pub fn device_refresh(top: &MapReader<'_>) -> Result<Option<Duration>, ConfigError> {
    let auto = matches!(top.get("devices").map(|n| &n.value), Some(Value::Str(s)) if s == "auto");
    match top.int("deviceRefresh")? {
        Some(s) if s < 0 => Err(top.err("deviceRefresh", "must be a number of seconds, 0 for off")),
        Some(0) => Ok(None),
        _ if !auto => Ok(None),
        s => Ok(Some(Duration::from_secs(
            s.map_or(DEFAULT_DEVICE_REFRESH_S, |s| s as u64),
        ))),
    }
}

/// Seconds between readings of the GPUs' processes when `deviceRefresh` is not set.
pub const DEFAULT_DEVICE_REFRESH_S: u64 = 5;

/// The fastest `loadBandwidth` taken, 1 TiB/s: far beyond any disk or network, and small
/// enough that no MiB count multiplies past a u64.
const MAX_LOAD_BANDWIDTH: u64 = 1 << 40;

/// `loadBandwidth`: MiB per second as a number, or a rate such as `500MiB/s`.
pub fn load_bandwidth(top: &MapReader<'_>) -> Result<u64, ConfigError> {
    let bytes = match top.get("loadBandwidth").map(|n| &n.value) {
        None => return Ok(DEFAULT_LOAD_BANDWIDTH),
        Some(Value::Int(mib)) if *mib > 0 => Some((*mib as u64).saturating_mul(1 << 20)),
        Some(Value::Str(s)) => parse_bytes(s.trim_end_matches("/s"))
            .ok()
            .filter(|b| *b > 0),
        Some(_) => None,
    };
    let bytes = bytes.ok_or_else(|| {
        top.err(
            "loadBandwidth",
            "must be MiB per second (150) or a rate such as 500MiB/s",
        )
    })?;
    if bytes > MAX_LOAD_BANDWIDTH {
        return Err(top.err("loadBandwidth", "must be at most 1TiB/s"));
    }
    Ok(bytes)
}

/// `hostMemory`: a size such as `64GiB`, or a number of bytes.
pub fn host_memory(top: &MapReader<'_>) -> Result<Option<u64>, ConfigError> {
    let bytes = match top.get("hostMemory").map(|n| &n.value) {
        None => return Ok(None),
        Some(Value::Int(b)) if *b > 0 => Some(*b as u64),
        Some(Value::Str(s)) => parse_bytes(s).ok().filter(|b| *b > 0),
        Some(_) => None,
    };
    bytes
        .map(Some)
        .ok_or_else(|| top.err("hostMemory", "must be a size such as 64GiB"))
}

pub fn seconds(r: &MapReader<'_>, key: &str) -> Result<Option<Duration>, ConfigError> {
    match r.int(key)? {
        None => Ok(None),
        Some(s) if s > 0 => Ok(Some(Duration::from_secs(s as u64))),
        Some(_) => Err(r.err(key, "must be a number of seconds above 0")),
    }
}

pub fn memory_spec(
    m: &MapReader<'_>,
    devices: &[Device],
    warnings: &mut Vec<String>,
) -> Result<MemorySpec, ConfigError> {
    let Some(node) = m.get("memory") else {
        return Ok(MemorySpec::default());
    };
    if matches!(&node.value, Value::Str(s) if s == "auto") {
        return Ok(MemorySpec::default());
    }
    if matches!(node.value, Value::Int(_)) || matches!(&node.value, Value::Str(_)) {
        return Ok(MemorySpec {
            bytes: bytes_value(m, "memory")?,
            ..Default::default()
        });
    }
    memory_mapping(m, node, devices, warnings)
}

/// `memory` given as a mapping: a size, or a parameter count to estimate one from, and the
/// devices the model may use.
fn memory_mapping(
    m: &MapReader<'_>,
    node: &Node,
    devices: &[Device],
    warnings: &mut Vec<String>,
) -> Result<MemorySpec, ConfigError> {
    let r = MapReader::new(
        node,
        &m.key("memory"),
        &["bytes", "params", "quant", "kvBytes", "host", "devices"],
        warnings,
    )?;
    let (params, quant) = params_and_quant(&r)?;
    Ok(MemorySpec {
        devices: wanted_devices(&r, devices)?,
        bytes: bytes_value(&r, "bytes")?,
        params,
        quant,
        kv_bytes: bytes_value(&r, "kvBytes")?.unwrap_or(0),
        host: bytes_value(&r, "host")?,
        pack: false,
    })
}

/// `memory.params` and `memory.quant`, the quantization checked where a size is estimated
/// from them.
fn params_and_quant(r: &MapReader<'_>) -> Result<(Option<u64>, Option<String>), ConfigError> {
    let params = match r.get("params").map(Node::scalar_text) {
        None => None,
        Some(Some(text)) => Some(parse_params(&text).map_err(|e| r.err("params", e))?),
        Some(None) => return Err(r.err("params", "must be a parameter count such as 7B")),
    };
    let quant = r.string("quant")?;
    if params.is_some() {
        let q = quant.clone().unwrap_or_else(|| "fp16".into());
        crate::memory::estimate_params(1, &q, 0).map_err(|e| r.err("quant", e))?;
    }
    Ok((params, quant))
}

/// `memory.devices`: configured devices, each named once.
fn wanted_devices(r: &MapReader<'_>, devices: &[Device]) -> Result<Vec<String>, ConfigError> {
    let wanted = r.strings("devices")?;
    if let Some(unknown) = wanted
        .iter()
        .find(|d| !devices.iter().any(|x| &x.name == *d))
    {
        return Err(r.err("devices", format!("{unknown:?} is not a configured device")));
    }
    // a device named twice would take two shares, each checked alone against its room
    if let Some(twice) =
        (wanted.iter().enumerate()).find_map(|(i, d)| wanted[..i].contains(d).then_some(d))
    {
        return Err(r.err("devices", format!("{twice:?} is named twice")));
    }
    Ok(wanted)
}

/// `params` and `quantization` on a model (what to serve, before any file is at hand) size it
/// when `memory` does not.
pub fn size_from_params(m: &MapReader<'_>, spec: &mut MemorySpec) -> Result<(), ConfigError> {
    let Some(text) = m.string("params")? else {
        if m.get("quantization").is_some() {
            m.string("quantization")?;
        }
        return Ok(());
    };
    if spec.bytes.is_some() || spec.params.is_some() {
        return Ok(());
    }
    let params = parse_params(&text).map_err(|e| m.err("params", e))?;
    let quant = m.string("quantization")?.unwrap_or_else(|| "fp16".into());
    crate::memory::estimate_params(1, &quant, 0).map_err(|e| m.err("quantization", e))?;
    spec.params = Some(params);
    spec.quant = Some(quant);
    Ok(())
}
