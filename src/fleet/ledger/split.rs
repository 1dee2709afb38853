//! Sharing a model no single device can hold over several devices.

use super::{charged, Charges, Holder};
use crate::config::Device;

/// How an engine shares a model over several devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharding {
    /// By layer, any share on each device (llama.cpp's `--tensor-split`): split in proportion to
    /// the devices' room.
    #[default]
    Layers,
    /// Tensor parallelism (vLLM, SGLang, TGI): every device takes the same share, and the count
    /// of devices must divide the model's attention heads, which a power of two does for the
    /// models these engines serve.
    Tensors,
}

/// True for a device a split may use: not a MIG instance, since CUDA shows a process one MIG
/// instance at most, so an engine split over two would see one of them.
fn splittable(device: &Device) -> bool {
    !device
        .select_as
        .as_deref()
        .is_some_and(|id| id.starts_with("MIG-"))
}

/// `need` split over several devices the way `sharding` allows; see [`split`] and [`split_evenly`].
pub(super) fn split_by(
    sharding: Sharding,
    devices: &[Device],
    need: u64,
    holders: &[Holder],
) -> Option<Charges> {
    match sharding {
        Sharding::Layers => split(devices, need, holders),
        Sharding::Tensors => split_evenly(devices, need, holders),
    }
}

/// A model no single device can hold, split over the fewest devices that can (those with the most
/// room first), each charged in proportion to its room: free memory now when that is enough, else
/// usable memory (room that evicting idle holders would make). `None` when no split is needed or
/// none can ever hold it.
pub(super) fn split(devices: &[Device], need: u64, holders: &[Holder]) -> Option<Charges> {
    if devices.len() < 2 || devices.iter().any(|d| d.usable() >= need) {
        return None;
    }
    let free = |d: usize| devices[d].usable().saturating_sub(charged(holders, d));
    let mut order: Vec<usize> = (0..devices.len())
        .filter(|d| splittable(&devices[*d]))
        .collect();
    order.sort_by_key(|d| {
        (
            std::cmp::Reverse(free(*d)),
            std::cmp::Reverse(devices[*d].usable()),
        )
    });
    let mut chosen = Vec::new();
    for d in order {
        chosen.push(d);
        if chosen.iter().map(|d| devices[*d].usable()).sum::<u64>() >= need {
            break;
        }
    }
    let room: u64 = chosen.iter().map(|d| free(*d)).sum();
    let basis = |d: usize| {
        if room >= need {
            free(d)
        } else {
            devices[d].usable()
        }
    };
    proportional(need, &chosen, basis).filter(|c| c.iter().all(|(d, b)| *b <= devices[*d].usable()))
}

/// A model no single device can hold, in equal shares over the fewest devices that can hold one
/// each, a power of two of them, all of one size (the ones with the most free memory first):
/// such an engine is told its share as a part of each card, the same part of every card, so on a
/// larger card it would take more than it was charged. `None` when no split is needed or no such
/// set of devices can ever hold it.
fn split_evenly(devices: &[Device], need: u64, holders: &[Holder]) -> Option<Charges> {
    if devices.len() < 2 || devices.iter().any(|d| d.usable() >= need) {
        return None;
    }
    let free = |d: usize| devices[d].usable().saturating_sub(charged(holders, d));
    let counts = std::iter::successors(Some(2usize), |n| n.checked_mul(2));
    for n in counts.take_while(|n| *n <= devices.len()) {
        let share = need.div_ceil(n as u64);
        let mut best: Option<Vec<usize>> = None;
        for size in devices.iter().map(|d| d.capacity) {
            let mut able: Vec<usize> = (0..devices.len())
                .filter(|d| devices[*d].capacity == size && devices[*d].usable() >= share)
                .filter(|d| splittable(&devices[*d]))
                .collect();
            if able.len() < n {
                continue;
            }
            able.sort_by_key(|d| (std::cmp::Reverse(free(*d)), *d));
            able.truncate(n);
            let room = |set: &[usize]| set.iter().map(|d| free(*d)).min();
            if best.as_ref().is_none_or(|b| room(&able) > room(b)) {
                best = Some(able);
            }
        }
        if let Some(set) = best {
            return Some(set.iter().map(|d| (*d, share)).collect());
        }
    }
    None
}

/// `need` shared over `chosen` in proportion to `basis`, the last one taking the rounding.
fn proportional(need: u64, chosen: &[usize], basis: impl Fn(usize) -> u64) -> Option<Charges> {
    let total: u128 = chosen.iter().map(|d| u128::from(basis(*d))).sum();
    if total == 0 {
        return None;
    }
    let mut left = need;
    let mut charges: Charges = chosen
        .iter()
        .map(|d| {
            let share = (u128::from(need) * u128::from(basis(*d)) / total) as u64;
            left -= share.min(left);
            (*d, share)
        })
        .collect();
    if let Some(last) = charges.last_mut() {
        last.1 += left;
    }
    Some(charges)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{gpu, holder, GIB};
    use super::super::{place, place_by, Holder, Placement};
    use super::Sharding;

    #[test]
    fn tensor_parallel_engines_get_equal_shares_over_a_power_of_two_of_devices() {
        let tensors = |devices: &[_], need, held: &[Holder]| {
            place_by(devices, need, &[], held, false, Sharding::Tensors)
        };
        // 8 GiB busy on g1: a layer split would charge 18 and 12, but each rank takes 15
        let two = [gpu("g0", 24), gpu("g1", 24)];
        let held = [Holder {
            devices: vec![(1, 8 * GIB)],
            ..holder("a", 8, true, 0)
        }];
        assert_eq!(
            tensors(&two, 30 * GIB, &held),
            Placement::Fits(vec![(0, 15 * GIB), (1, 15 * GIB)])
        );
        // 20 GiB busy on g1: 15 does not fit there now, so waiting is the answer, not 24 and 6
        let busy = [Holder {
            devices: vec![(1, 20 * GIB)],
            ..holder("a", 20, true, 0)
        }];
        assert!(matches!(
            tensors(&two, 30 * GIB, &busy),
            Placement::Blocked(_)
        ));
        // three devices can hold 50 GiB, but not in three ranks: four would, and there are none
        let three = [gpu("g0", 24), gpu("g1", 24), gpu("g2", 24)];
        assert!(matches!(
            tensors(&three, 50 * GIB, &[]),
            Placement::Never(_)
        ));
        assert!(
            matches!(place(&three, 50 * GIB, &[], &[]), Placement::Fits(c) if c.len() == 3),
            "layers split over three"
        );
        // the two with the most room take the ranks; a small device is left out
        let mixed = [gpu("small", 8), gpu("g1", 24), gpu("g2", 24), gpu("g3", 24)];
        assert_eq!(
            tensors(&mixed, 40 * GIB, &[]),
            Placement::Fits(vec![(1, 20 * GIB), (2, 20 * GIB)])
        );
        // one device that holds it beats a split
        assert_eq!(
            tensors(&mixed, 20 * GIB, &[]),
            Placement::Fits(vec![(1, 20 * GIB)])
        );
        // never a 48 and an 80 GiB card together: told 45/48 of each card, the engine would
        // take 75 GiB of the larger one
        let sizes = [gpu("a80", 80), gpu("b80", 80), gpu("c48", 48)];
        let busy_b = [Holder {
            devices: vec![(1, 40 * GIB)],
            ..holder("b", 40, true, 0)
        }];
        assert!(matches!(
            tensors(&sizes, 90 * GIB, &busy_b),
            Placement::Blocked(_)
        ));
        assert_eq!(
            tensors(&sizes, 90 * GIB, &[]),
            Placement::Fits(vec![(0, 45 * GIB), (1, 45 * GIB)])
        );
    }

    /// CUDA shows a process one MIG instance at most: a model no instance holds is never split
    /// over two of them, by layer or by tensor.
    #[test]
    fn mig_instances_are_never_split_over() {
        let mig = |name: &str| super::Device {
            select_as: Some(format!("MIG-{name}")),
            ..gpu(name, 24)
        };
        let two = [mig("a"), mig("b")];
        for sharding in [Sharding::Layers, Sharding::Tensors] {
            let placed = place_by(&two, 30 * GIB, &[], &[], false, sharding);
            assert!(matches!(placed, Placement::Never(_)), "{placed:?}");
        }
        // a whole GPU beside them still takes part in a split
        let mixed = [mig("a"), gpu("g1", 24), gpu("g2", 24)];
        assert_eq!(
            place(&mixed, 30 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 15 * GIB), (2, 15 * GIB)])
        );
    }

    #[test]
    fn a_model_no_device_holds_is_split_in_proportion_to_the_room() {
        let two = [gpu("g0", 24), gpu("g1", 24)];
        assert_eq!(
            place(&two, 30 * GIB, &[], &[]),
            Placement::Fits(vec![(0, 15 * GIB), (1, 15 * GIB)])
        );
        // 8 GiB busy on g1: 24 and 16 free, so 18 and 12 of 30
        let held = [Holder {
            devices: vec![(1, 8 * GIB)],
            ..holder("a", 8, true, 0)
        }];
        assert_eq!(
            place(&two, 30 * GIB, &[], &held),
            Placement::Fits(vec![(0, 18 * GIB), (1, 12 * GIB)])
        );
        // the fewest devices that can hold it: the two large ones, not the small one too
        let three = [gpu("small", 8), gpu("g1", 24), gpu("g2", 24)];
        assert_eq!(
            place(&three, 30 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 15 * GIB), (2, 15 * GIB)])
        );
        assert!(matches!(
            place(&two, 60 * GIB, &[], &[]),
            Placement::Never(_)
        ));
        // one device that can hold it beats a split
        assert_eq!(
            place(&three, 20 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 20 * GIB)])
        );
    }
}
