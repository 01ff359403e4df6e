//! `--format timm`: the export has exactly timm's names and shapes (fixture from timm itself,
//! `reference/timm_check.py --keys-out`), and a forward pass written independently here in
//! timm's layout (fused qkv, [out, in] weights, a convolution for patches) on the exported
//! tensors gives our encoder's tokens. A wrong transpose, qkv order or patch layout fails it.

use std::collections::BTreeMap;

use burn::tensor::{Tensor, TensorData};
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::Manifest;
use dpcap_ml::model::{CaptionerConfig, Encoder, EncoderConfig};
use dpcap_ml::params::ParamSet;
use dpcap_ml::timm::export_timm;
use safetensors::SafeTensors;

type Inner = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

fn manifest(privacy: &str) -> Manifest {
    serde_json::from_value(serde_json::json!({
        "job_id": "job-1", "step": 3, "ledger_position": 3, "model": "micro", "objective": "caption",
        "parameters": 1, "generation": 1, "created_unix_ms": 0, "privacy": privacy,
    }))
    .unwrap()
}

/// The micro encoder with every value distinct (biases and norms included), so that a
/// mapping that swaps two tensors of the same shape changes the output.
fn encoder() -> (Encoder, ParamSet<Inner>, EncoderConfig) {
    let config = CaptionerConfig::named("micro").unwrap().encoder;
    let mut params = ParamSet::<Inner>::seeded(&Default::default(), 3);
    let encoder = Encoder::new(&mut params, "encoder", config);
    for (k, id) in params.ids().enumerate() {
        let n = params.spec(id).numel();
        let base = if params.spec(id).name.ends_with("gamma") { 1.0 } else { 0.0 };
        let values: Vec<f32> = (0..n).map(|i| base + 0.15 * (0.37 * i as f32 + 1.3 * k as f32 + 0.1).sin()).collect();
        params.set(id, Tensor::from_data(TensorData::new(values, [n]), &Default::default()));
    }
    (encoder, params, config)
}

fn tensor(file: &SafeTensors<'_>, name: &str) -> Vec<f64> {
    let view = file.tensor(name).unwrap_or_else(|_| panic!("no {name}"));
    view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()
}

/// y = W x + b with W [out, in] (PyTorch's nn.Linear).
fn linear(w: &[f64], b: &[f64], x: &[f64]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(o, bo)| bo + x.iter().enumerate().map(|(i, xi)| w[o * x.len() + i] * xi).sum::<f64>())
        .collect()
}

fn layer_norm(w: &[f64], b: &[f64], x: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    x.iter().enumerate().map(|(i, v)| (v - mean) / (var + 1e-5).sqrt() * w[i] + b[i]).collect()
}

/// erf by Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

/// timm's VisionTransformer forward_features on one image [3, H, W], from the state dict.
fn timm_tokens(file: &SafeTensors<'_>, config: EncoderConfig, image: &[f64]) -> Vec<Vec<f64>> {
    let (p, d, side, grid) = (config.patch, config.width, config.image, config.image / config.patch);
    let (conv, conv_b, pos) =
        (tensor(file, "patch_embed.proj.weight"), tensor(file, "patch_embed.proj.bias"), tensor(file, "pos_embed"));
    let mut x: Vec<Vec<f64>> = (0..grid * grid)
        .map(|n| {
            let (gy, gx) = (n / grid, n % grid);
            (0..d)
                .map(|o| {
                    let mut acc = conv_b[o] + pos[n * d + o];
                    for c in 0..3 {
                        for ky in 0..p {
                            for kx in 0..p {
                                let pixel = image[c * side * side + (gy * p + ky) * side + gx * p + kx];
                                acc += conv[((o * 3 + c) * p + ky) * p + kx] * pixel;
                            }
                        }
                    }
                    acc
                })
                .collect()
        })
        .collect();
    let hd = d / config.heads;
    for i in 0..config.depth {
        let t = |name: &str| tensor(file, &format!("blocks.{i}.{name}"));
        let (n1w, n1b, qkv_w, qkv_b, proj_w, proj_b) = (
            t("norm1.weight"),
            t("norm1.bias"),
            t("attn.qkv.weight"),
            t("attn.qkv.bias"),
            t("attn.proj.weight"),
            t("attn.proj.bias"),
        );
        let qkv: Vec<Vec<f64>> = x.iter().map(|row| linear(&qkv_w, &qkv_b, &layer_norm(&n1w, &n1b, row))).collect();
        let attended: Vec<Vec<f64>> = (0..x.len())
            .map(|q| {
                let mut out = vec![0.0; d];
                for h in 0..config.heads {
                    let score = |k: usize| {
                        (0..hd).map(|j| qkv[q][h * hd + j] * qkv[k][d + h * hd + j]).sum::<f64>() / (hd as f64).sqrt()
                    };
                    let scores: Vec<f64> = (0..x.len()).map(score).collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for (k, s) in scores.iter().enumerate() {
                        for j in 0..hd {
                            out[h * hd + j] += (s - max).exp() / z * qkv[k][2 * d + h * hd + j];
                        }
                    }
                }
                out
            })
            .collect();
        let (n2w, n2b, fc1_w, fc1_b, fc2_w, fc2_b) = (
            t("norm2.weight"),
            t("norm2.bias"),
            t("mlp.fc1.weight"),
            t("mlp.fc1.bias"),
            t("mlp.fc2.weight"),
            t("mlp.fc2.bias"),
        );
        for (row, att) in x.iter_mut().zip(&attended) {
            let a = linear(&proj_w, &proj_b, att);
            row.iter_mut().zip(&a).for_each(|(r, a)| *r += a);
            let h: Vec<f64> = linear(&fc1_w, &fc1_b, &layer_norm(&n2w, &n2b, row))
                .iter()
                .map(|v| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)))
                .collect();
            let m = linear(&fc2_w, &fc2_b, &h);
            row.iter_mut().zip(&m).for_each(|(r, m)| *r += m);
        }
    }
    let (nw, nb) = (tensor(file, "norm.weight"), tensor(file, "norm.bias"));
    x.iter().map(|row| layer_norm(&nw, &nb, row)).collect()
}

#[test]
fn a_timm_export_has_exactly_timms_names_and_shapes() {
    let (_, params, config) = encoder();
    let bytes = export_timm(&params, config, &manifest("dp")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let ours: BTreeMap<String, Vec<usize>> =
        file.tensors().into_iter().map(|(name, view)| (name, view.shape().to_vec())).collect();
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("data/timm_vit_micro_keys.json")).expect("fixture is JSON");
    let timm: BTreeMap<String, Vec<usize>> = serde_json::from_value(fixture["keys"].clone()).unwrap();
    assert_eq!(ours, timm, "strict=True needs the same names and shapes");
    let args = dpcap_ml::timm::model_args(config);
    assert_eq!(args, fixture["model_args"], "the fixture was made for these arguments");
}

#[test]
fn timms_forward_on_the_exported_tensors_gives_our_encoders_tokens() {
    let (encoder, params, config) = encoder();
    let bytes = export_timm(&params, config, &manifest("dp")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let side = config.image;
    let pixels: Vec<f32> = (0..2 * 3 * side * side).map(|i| (0.61 * i as f32).sin() * 1.7).collect();
    let images =
        Tensor::<CpuBackend, 4>::from_data(TensorData::new(pixels.clone(), [2, 3, side, side]), &Default::default());
    let ours: Vec<f32> = encoder.tokens(&params, images).into_data().to_vec().unwrap();
    let (n, d) = (config.patches(), config.width);
    let mut worst = 0.0f64;
    for b in 0..2 {
        let image: Vec<f64> =
            pixels[b * 3 * side * side..(b + 1) * 3 * side * side].iter().map(|&v| v as f64).collect();
        for (t, row) in timm_tokens(&file, config, &image).iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                worst = worst.max((v - ours[(b * n + t) * d + j] as f64).abs());
            }
        }
    }
    assert!(worst < 1e-4, "timm-layout forward differs from ours by {worst}");
}

#[test]
fn a_timm_export_carries_provenance_and_a_not_private_notice() {
    let (_, params, config) = encoder();
    for privacy in ["dp", "not_private", "simulation"] {
        let bytes = export_timm(&params, config, &manifest(privacy)).unwrap();
        let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
        let metadata = header.metadata().clone().unwrap_or_default();
        assert_eq!(metadata.get("dpcap.privacy").map(String::as_str), Some(privacy));
        assert_eq!(metadata.get("dpcap.job_id").map(String::as_str), Some("job-1"));
        let notice = metadata.get("dpcap.notice");
        assert_eq!(notice.is_some_and(|n| n.starts_with("NOT PRIVATE")), privacy != "dp", "{privacy}: {notice:?}");
        assert!(metadata.contains_key("timm.model_args") && metadata.contains_key("timm.norm_eps"));
    }
}
