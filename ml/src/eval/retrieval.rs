//! Retrieval on held-out identities (DP-FedEmb's evaluation): every held-out image queries
//! all the others by cosine similarity of their embeddings, and recall@k is the fraction of
//! queries with an image of the same identity among their k nearest neighbours. The held-out
//! identities belong to no user, so the score measures how the embedding generalises, and it
//! is post-processing of the released weights.

use burn::tensor::backend::AutodiffBackend;

use super::{BATCH, EvalError, check_pixels};
use crate::model::Embedder;
use crate::params::ParamSet;
use crate::trainer::images_tensor;
use dpcap_dataset::Example;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Recall at 1 and at 5 over the held-out queries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recall {
    /// Fraction of queries whose nearest neighbour shares their identity.
    pub at_1: f64,
    /// Fraction of queries with one of the same identity among their 5 nearest neighbours.
    pub at_5: f64,
    /// Queries scored (every held-out image).
    pub queries: usize,
}

/// Unit embeddings of `examples`, one row per example.
pub fn embeddings<AB: AutodiffBackend>(
    model: &Embedder,
    params: &ParamSet<Inner<AB>>,
    examples: &[Example],
) -> Result<Vec<Vec<f32>>, EvalError> {
    let side = model.encoder().config().image;
    check_pixels(examples, side)?;
    let device: AB::Device = params.device().clone();
    let mut rows = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(BATCH) {
        let e = model.embeddings::<AB>(params, images_tensor::<AB>(chunk, side, &device));
        let d = e.dims()[1];
        let values = e.into_data().into_vec::<f32>().map_err(EvalError::Tensor)?;
        rows.extend(values.chunks(d).map(<[f32]>::to_vec));
    }
    Ok(rows)
}

/// Leave-one-out recall@k for each k of `ks`: neighbours ranked by descending dot product
/// (cosine for unit rows), ties by position so that a constant embedding scores what its
/// ordering gives and nothing more. Every identity needs at least two images.
pub fn recall_at(rows: &[Vec<f32>], labels: &[u32], ks: &[usize]) -> Result<Vec<f64>, EvalError> {
    if rows.len() != labels.len() || rows.len() < 2 {
        return Err(EvalError::Input(format!(
            "{} embeddings for {} labels; retrieval needs 2 or more",
            rows.len(),
            labels.len()
        )));
    }
    if let Some(lonely) = labels.iter().find(|&&l| labels.iter().filter(|&&m| m == l).count() < 2) {
        return Err(EvalError::Input(format!("identity {lonely} has one image: nothing can retrieve it")));
    }
    let mut hits = vec![0usize; ks.len()];
    for (i, query) in rows.iter().enumerate() {
        let mut ranked: Vec<(f32, usize)> = rows
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(j, row)| (query.iter().zip(row).map(|(a, b)| a * b).sum::<f32>(), j))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let first_match = ranked.iter().position(|&(_, j)| labels[j] == labels[i]);
        for (hit, &k) in hits.iter_mut().zip(ks) {
            *hit += usize::from(first_match.is_some_and(|p| p < k));
        }
    }
    Ok(hits.into_iter().map(|h| h as f64 / rows.len() as f64).collect())
}

/// Recall@1 and @5 of `model` on `examples` (labels are identities).
pub fn recall<AB: AutodiffBackend>(
    model: &Embedder,
    params: &ParamSet<Inner<AB>>,
    examples: &[Example],
) -> Result<Recall, EvalError> {
    let labels: Vec<u32> = examples
        .iter()
        .map(|e| e.label.ok_or_else(|| EvalError::Input(format!("held-out image {} has no identity", e.key))))
        .collect::<Result<_, _>>()?;
    let rows = embeddings::<AB>(model, params, examples)?;
    let r = recall_at(&rows, &labels, &[1, 5])?;
    Ok(Recall { at_1: r[0], at_5: r[1], queries: rows.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_a_query_whose_neighbours_share_its_identity() {
        // Identities 0 and 1 cluster apart, except query 2 which sits with identity 1.
        let rows = vec![vec![1.0, 0.0], vec![0.99, 0.14], vec![0.0, 1.0], vec![0.1, 0.99], vec![0.14, 0.99]];
        let labels = [0, 0, 0, 1, 1];
        let r = recall_at(&rows, &labels, &[1, 2, 4]).unwrap();
        assert_eq!(r, vec![4.0 / 5.0, 4.0 / 5.0, 1.0]);
    }

    #[test]
    fn a_constant_embedding_retrieves_by_position_only() {
        let rows = vec![vec![1.0, 0.0]; 6];
        let labels = [0, 1, 2, 0, 1, 2];
        // Ties rank by position: a query's first neighbours are the first rows, so each query
        // finds its identity only as far down as position order puts it.
        // Only query 3 has its identity (row 0) first.
        let r = recall_at(&rows, &labels, &[1, 5]).unwrap();
        assert_eq!(r, vec![1.0 / 6.0, 1.0]);
    }

    #[test]
    fn retrieval_refuses_an_identity_with_one_image() {
        let rows = vec![vec![1.0], vec![1.0], vec![1.0]];
        let err = recall_at(&rows, &[0, 0, 1], &[1]).unwrap_err();
        assert!(err.to_string().contains("identity 1 has one image"), "{err}");
    }

    /// Pixel-space nearest neighbours find a synthetic identity's other images far above
    /// chance but far from always: the task is learnable, and the nuisance leaves room to learn.
    #[test]
    fn held_out_identities_are_retrievable_from_pixels_above_chance() {
        use dpcap_dataset::identities::{IdentityLayout, heldout};
        let layout = IdentityLayout { users: 5, identities_per_user: 2, images_per_identity: 3 };
        let held = heldout(0, &layout, 100, 4, 32);
        let rows: Vec<Vec<f32>> = held
            .iter()
            .map(|e| {
                let v: Vec<f32> = e.image.as_raw().iter().map(|&p| f32::from(p) / 255.0).collect();
                let mean = v.iter().sum::<f32>() / v.len() as f32;
                let centred: Vec<f32> = v.iter().map(|x| x - mean).collect();
                let norm = centred.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                centred.iter().map(|x| x / norm).collect()
            })
            .collect();
        let labels: Vec<u32> = held.iter().map(|e| e.label).collect();
        let r = recall_at(&rows, &labels, &[1, 5]).unwrap();
        eprintln!("pixel recall@1 {:.3} @5 {:.3}", r[0], r[1]);
        assert!(r[0] > 0.05, "pixel recall@1 {r:?} vs chance 0.0075");
    }
}
