//! Which files of a Hugging Face repository a model folder takes, as vLLM and the other engines
//! that load a folder choose them: everything but the same weights in another format. A repository
//! often carries its weights twice or three times (safetensors beside PyTorch `.bin`, TensorFlow
//! and Flax files; Meta's `original/` checkpoint; Mistral's `consolidated.safetensors` beside the
//! sharded `model-*.safetensors`), and fetching all of them would take several times the bytes,
//! the disk and the time the engine needs, and size the model as several times itself.

/// Weight formats an engine reads only when a repository has no safetensors.
const OTHER_WEIGHTS: [&str; 7] = [".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".ot"];

/// The files of `names` (a repository's listing) that a model folder takes.
pub(crate) fn folder_files<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let kept: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !n.starts_with("original/"))
        .collect();
    let safetensors = kept.iter().any(|n| n.ends_with(".safetensors"));
    let sharded = kept.iter().any(|n| is_shard(n));
    kept.into_iter()
        .filter(|n| !(safetensors && is_other_weights(n.trim_end_matches(".index.json"))))
        .filter(|n| !(sharded && is_consolidated(n)))
        .collect()
}

fn base(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Weights in a format other than safetensors (a tokenizer's or the trainer's `.bin` files are
/// not weights and stay); with `.index.json` trimmed off, also their shard index, which a model
/// folder must not name shards it does not hold with.
fn is_other_weights(name: &str) -> bool {
    let b = base(name);
    let weights_bin = b.starts_with("pytorch_model") || b.starts_with("model");
    OTHER_WEIGHTS.iter().any(|e| b.ends_with(e)) && (!b.ends_with(".bin") || weights_bin)
}

/// `model.safetensors` or one of `model-00001-of-00004.safetensors`, at the top of the repository.
fn is_shard(name: &str) -> bool {
    !name.contains('/') && name.starts_with("model") && name.ends_with(".safetensors")
}

/// Mistral's single-file checkpoint (`consolidated.safetensors`, `consolidated.00.pth`).
fn is_consolidated(name: &str) -> bool {
    base(name).starts_with("consolidated")
}

#[cfg(test)]
mod tests {
    use super::folder_files;

    #[test]
    fn a_folder_takes_its_weights_once() {
        let llama = [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "original/consolidated.00.pth",
            "original/params.json",
            "pytorch_model-00001-of-00002.bin",
            "pytorch_model-00002-of-00002.bin",
            "pytorch_model.bin.index.json",
            "tf_model.h5",
            "flax_model.msgpack",
            "tokenizer.json",
            "training_args.bin",
            "onnx/model.onnx",
        ];
        assert_eq!(
            folder_files(&llama),
            [
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json",
                "training_args.bin",
                "onnx/model.onnx",
            ]
        );
        let mistral = [
            "consolidated.safetensors",
            "model-00001-of-00001.safetensors",
            "params.json",
        ];
        assert_eq!(
            folder_files(&mistral),
            ["model-00001-of-00001.safetensors", "params.json"]
        );
        // no safetensors: the PyTorch weights are the weights
        let old = ["config.json", "pytorch_model.bin", "vocab.txt"];
        assert_eq!(folder_files(&old), old);
        // a checkpoint alone stays
        assert_eq!(
            folder_files(&["consolidated.safetensors", "params.json"]),
            ["consolidated.safetensors", "params.json"]
        );
    }
}
