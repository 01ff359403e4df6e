//! User-level sampling (DP-FedEmb): the sampler draws clients, each independently with
//! probability q over N_clients; a sampled client's examples all go, together, to one rank;
//! and the split never mixes two clients in a unit.

use super::common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{job, submit, worker};
use dpcap_coordinator::State;
use dpcap_coordinator::{ClientUnit, JobSecret, PoissonSampler, share_units, split_clients};
use dpcap_dataset::index::{Layout, UserTable};

/// `users` users with 1 to 5 examples each, their examples scattered over the dataset in a
/// fixed shuffle, so a user's examples span shards.
fn table(users: u64) -> (UserTable, u64) {
    let mut pairs = Vec::new();
    let mut next = 0u64;
    for u in 0..users {
        for _ in 0..1 + (u * 7 + 3) % 5 {
            pairs.push((format!("user-{u}"), next));
            next += 1;
        }
    }
    let n = next;
    // Scatter: example e goes to position (e · 7919) mod n (7919 is prime and coprime with n here).
    assert_ne!(n % 7919, 0);
    let pairs = pairs.into_iter().map(|(u, e)| (u, e * 7919 % n)).collect::<Vec<_>>();
    (UserTable::from_pairs(pairs), n)
}

/// The clients of `units` on each rank, as sets of global examples, by (rank, ordinal).
fn clients_by_rank(ranks: &[Vec<ClientUnit>], counts: &[u64]) -> Vec<Vec<Vec<u64>>> {
    let starts: Vec<u64> = counts.iter().scan(0, |s, &c| Some(std::mem::replace(s, *s + c))).collect();
    ranks
        .iter()
        .map(|units| {
            let mut clients: Vec<Vec<u64>> = Vec::new();
            for (i, u) in units.iter().enumerate() {
                let new = i == 0 || units[i - 1].client != u.client;
                if new {
                    assert_eq!(u.client as usize, clients.len(), "ordinals count up from 0, one per client");
                    clients.push(Vec::new());
                }
                let globals = u.unit.indices.iter().map(|&l| starts[u.unit.shard] + l);
                clients.last_mut().unwrap().extend(globals);
            }
            clients.iter_mut().for_each(|c| c.sort_unstable());
            clients
        })
        .collect()
}

#[test]
fn a_clients_examples_go_whole_to_one_rank_and_never_mix_with_anothers() {
    let (table, n) = table(300);
    let counts = [n / 3, n / 3, n - 2 * (n / 3)];
    let layout = Layout::from_counts(&counts);
    let clients = table.clients(1);
    let sample = PoissonSampler::new(JobSecret([5; 32]), clients.len() as u64, 0.3).unwrap().sample(2);
    let sampled: Vec<&[u64]> = sample.iter().map(|&c| clients[c as usize].as_slice()).collect();
    for world in [1usize, 2, 3] {
        let ranks = split_clients(&sampled, &layout, world);
        let got: Vec<Vec<u64>> = clients_by_rank(&ranks, &counts).into_iter().flatten().collect();
        let want: Vec<Vec<u64>> = sampled.iter().map(|c| c.to_vec()).collect();
        assert_eq!(got, want, "{world} ranks: every sampled client, whole, once, in order");
        let shares: Vec<u64> = ranks.iter().map(|units| share_units(units, true)).collect();
        let by_rank = clients_by_rank(&ranks, &counts);
        for (share, clients) in shares.iter().zip(&by_rank) {
            assert_eq!(*share, clients.len() as u64, "{world} ranks: a rank's share counts its clients");
        }
        assert_eq!(shares.iter().sum::<u64>(), sampled.len() as u64, "{world} ranks: the shares add up");
    }
}

#[test]
fn virtual_clients_group_whole_users_by_a_fixed_tag() {
    let (table, n) = table(200);
    for k in [1u32, 3, 10] {
        let clients = table.clients(k);
        assert_eq!(clients.len(), 200usize.div_ceil(k as usize));
        let mut all: Vec<u64> = clients.concat();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "k = {k}: each example in exactly one client");
        let owner: HashMap<u64, usize> =
            clients.iter().enumerate().flat_map(|(c, ex)| ex.iter().map(move |&e| (e, c))).collect();
        for u in 0..table.users() {
            let homes: std::collections::BTreeSet<usize> = table.examples_of(u).iter().map(|e| owner[e]).collect();
            assert_eq!(homes.len(), 1, "k = {k}: user {u} is split across clients {homes:?}");
        }
    }
}

#[test]
fn clients_are_sampled_independently_with_probability_q_and_their_examples_come_whole() {
    let (users, q, steps) = (400u64, 0.1, 1000u64);
    let (table, n) = table(users);
    let counts = [n / 2, n - n / 2];
    let clients = Arc::new(table.clients(1));
    let mut state = State::default();
    let mut entry = job("fed", 2, steps);
    entry.sampler = PoissonSampler::new(JobSecret([9; 32]), users, q).unwrap();
    entry.layout = Layout::from_counts(&counts);
    entry.clients = Some(clients.clone());
    submit(&mut state, entry);
    worker(&mut state, "w0");
    worker(&mut state, "w1");
    state.schedule();
    let owner: HashMap<Vec<u64>, usize> = clients.iter().enumerate().map(|(c, ex)| (ex.clone(), c)).collect();
    let (mut sizes, mut inclusions, mut both) = (Vec::new(), vec![0u64; users as usize], 0u64);
    for t in 0..steps {
        let group = state.jobs.get_mut("fed").unwrap().group.as_mut().unwrap();
        (group.step, group.work) = (Some(t), None);
        let ranks: Vec<Vec<ClientUnit>> = (0..2).map(|r| state.work_for("fed", r).unwrap().1).collect();
        let mut sampled: Vec<usize> = clients_by_rank(&ranks, &counts)
            .into_iter()
            .flatten()
            .map(|examples| *owner.get(&examples).expect("a sampled client's examples are exactly its own"))
            .collect();
        sampled.sort_unstable();
        sizes.push(sampled.len() as f64);
        for &c in &sampled {
            inclusions[c] += 1;
        }
        both += u64::from(sampled.contains(&0) && sampled.contains(&1));
    }
    let mean = sizes.iter().sum::<f64>() / steps as f64;
    let var = sizes.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (steps - 1) as f64;
    assert!((mean - 40.0).abs() < 1.0, "mean clients per step {mean}, expected q N_users = 40");
    assert!((28.0..45.0).contains(&var), "clients per step variance {var}, expected Nq(1-q) = 36");
    let expected = steps as f64 * q;
    let chi2: f64 = inclusions.iter().map(|&c| (c as f64 - expected).powi(2) / (expected * (1.0 - q))).sum();
    assert!((310.0..490.0).contains(&chi2), "chi-square {chi2} over 400 clients");
    // Clients 0 and 1 together: q² of the steps, independently of each other.
    assert!((both as f64 - 10.0).abs() < 5.0 * 10f64.sqrt(), "clients 0 and 1 both sampled {both} times, expected 10");
}

#[test]
fn a_user_level_job_whose_clients_are_not_loaded_gets_no_work() {
    let mut state = State::default();
    let mut entry = job("fed", 1, 3);
    entry.job.plan.as_mut().unwrap().clients = 100;
    submit(&mut state, entry);
    worker(&mut state, "w0");
    state.schedule();
    let group = state.jobs.get_mut("fed").unwrap().group.as_mut().unwrap();
    group.step = Some(0);
    assert!(state.work_for("fed", 0).is_none(), "client numbers must never be read as examples");
}
