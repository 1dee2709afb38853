//! Arbitrary bytes into the header reader: it must never panic, and what it
//! accepts must survive a write/read round trip through the writer.
#![no_main]

use gguf::{read_header, read_header_sized, Writer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let streamed = read_header(data);
    let sized = read_header_sized(data, data.len() as u64);
    if let Ok(h) = &sized {
        // Knowing the size only adds checks. (Debug, not ==, so NaN floats
        // compare equal to themselves.)
        let s = streamed
            .as_ref()
            .expect("sized read worked, streamed must too");
        assert_eq!(format!("{s:?}"), format!("{h:?}"));
    }
    let Ok(h) = streamed else { return };
    let _ = (
        h.tensor_bytes(),
        h.n_elements(),
        h.data_end(),
        h.architecture(),
    );
    if h.data_end() > 1 << 20 {
        return; // write_to would write every zero (data and alignment padding)
    }
    let mut w = Writer::with_version(h.version);
    for (k, v) in &h.metadata {
        w.set(k.clone(), v.clone());
    }
    for t in &h.tensors {
        w.add_zero_tensor(t.name.clone(), &t.dims, t.ggml_type);
    }
    let mut out = Vec::new();
    w.write_to(&mut out)
        .expect("a header that was read can be written");
    let back = read_header_sized(&out[..], out.len() as u64).expect("what we wrote reads back");
    assert_eq!(format!("{:?}", back.metadata), format!("{:?}", h.metadata));
    assert_eq!(back.tensors.len(), h.tensors.len());
    for (a, b) in back.tensors.iter().zip(&h.tensors) {
        assert_eq!(
            (&a.name, &a.dims, a.ggml_type, a.n_bytes),
            (&b.name, &b.dims, b.ggml_type, b.n_bytes)
        );
    }
});
