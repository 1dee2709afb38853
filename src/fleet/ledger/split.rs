//! Sharing a model no single device can hold over several devices.

use super::{charged, Charges, Holder};
use crate::config::Device;

/// A model no single device can hold, split over the fewest devices that can (those with the most
/// room first), each charged in proportion to its room: free memory now when that is enough, else
/// usable memory (room that evicting idle holders would make). `None` when no split is needed or
/// none can ever hold it.
pub(super) fn split(devices: &[Device], need: u64, holders: &[Holder]) -> Option<Charges> {
    if devices.len() < 2 || devices.iter().any(|d| d.usable() >= need) {
        return None;
    }
    let free = |d: usize| devices[d].usable().saturating_sub(charged(holders, d));
    let mut order: Vec<usize> = (0..devices.len()).collect();
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
    use super::super::{place, Holder, Placement};

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
