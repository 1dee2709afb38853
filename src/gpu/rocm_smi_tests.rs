use super::*;

/// `rocm-smi --showmeminfo vram --showuniqueid --json` on a two-GPU MI210 machine.
const MEMINFO: &str = r#"{"card0": {"VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "10993664", "Unique ID": "0x18f68e602b8a790f"}, "card1": {"VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "21474836480", "Unique ID": "N/A"}}"#;

#[test]
fn cards_become_amd_devices_with_their_vram() {
    let gpus = parse_gpus(MEMINFO).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].uuid.as_deref(), Some("0x18f68e602b8a790f"));
    assert_eq!(gpus[1].uuid, None);
    let g = &gpus[1];
    assert_eq!((g.name().as_str(), g.selector().as_str()), ("rocm1", "1"));
    assert_eq!(g.total, 68_702_699_520);
    assert_eq!(g.vendor, Vendor::Amd);
}

#[test]
fn cards_are_ordered_by_index_and_other_keys_ignored() {
    let json = r#"{"card10": {"VRAM Total Memory (B)": "2"}, "card2": {"VRAM Total Memory (B)": "1"},
        "system": {"Driver version": "6.8"}, "card3": {"VRAM Total Memory (B)": "N/A"}}"#;
    let indices: Vec<u32> = parse_gpus(json).unwrap().iter().map(|g| g.index).collect();
    assert_eq!(indices, [2, 10]);
    assert_eq!(
        parse_gpus("WARNING: AMD GPU device(s) is/are in a low-power state"),
        None
    );
}

#[test]
fn pids_give_their_vram_counted_from_the_end_of_the_row() {
    let json = r#"{"system": {"PID4242": "python3, 1, 21474836480, 0, 0",
        "PID77": "my, trainer, 2, 1073741824, 0, 12", "PID9": "ollama, 1, unknown, unknown, unknown"}}"#;
    let vram = parse_pids(json).unwrap();
    assert_eq!(vram.get(&4242), Some(&(20 << 30)));
    assert_eq!(vram.get(&77), Some(&(1 << 30)));
    assert_eq!(vram.get(&9), None);
    assert!(parse_pids("{}").unwrap().is_empty());
    assert_eq!(parse_pids("No KFD PIDs currently running"), None);
}

#[test]
fn pid_gpus_are_read_from_the_text_listing() {
    let text = "============================ GPUs Indexed by PID ============================\n\
        PID 4242 is using 1 DRM device(s):\n0 \n\
        PID 77 is using 2 DRM device(s):\n0 1 \n\
        PID 9 is using 0 DRM device(s)\n\
        ==============================================================================\n";
    let map = parse_pid_gpus(text);
    assert_eq!(map[&4242], ["0"]);
    assert_eq!(map[&77], ["0", "1"]);
    assert!(map[&9].is_empty());
}

#[test]
fn vram_goes_to_the_gpus_named_split_evenly_or_to_the_only_one() {
    let vram = HashMap::from([(1, 20 << 30), (2, 2 << 30), (3, 5)]);
    let gpus_of = HashMap::from([
        (1, vec!["1".to_string()]),
        (2, vec!["0".into(), "1".into()]),
    ]);
    let two = ["0".to_string(), "1".to_string()];
    let rows: Vec<_> = attribute(&vram, &gpus_of, &two)
        .into_iter()
        .map(|r| (r.pid, r.device, r.bytes))
        .collect();
    assert_eq!(
        rows,
        [
            (1, "1".into(), 20 << 30),
            (2, "0".into(), 1 << 30),
            (2, "1".into(), 1 << 30)
        ],
        "pid 3's GPU is unknown among two: not counted"
    );
    let one = ["0".to_string()];
    let rows = attribute(&HashMap::from([(3, 5)]), &HashMap::new(), &one);
    assert_eq!((rows[0].device.as_str(), rows[0].bytes), ("0", 5));
}
