//! Which lane each image of an epoch is offered to: the GPU lane's share over the epoch's
//! positions, one step at a time, and the rule that turns a share into offered images.

use std::sync::RwLock;

/// Whether image `index` is offered to the GPU lane under `share` (0 to 1): a hash of the index
/// below the share, so the offered images are spread evenly and fixed by the index alone; a
/// larger share offers a superset.
pub fn offered(index: usize, share: f32) -> bool {
    let z = crate::random::Draws::new(index as u64).next();
    ((z >> 40) as f32) < share * (1u64 << 24) as f32
}

/// The GPU lane's share over the positions of an epoch: from each step's position on, the share
/// of the images it is offered. Both lanes read it, and a step is only ever added past every
/// position either lane has looked at, so they always agree on which lane an image is for.
#[derive(Debug)]
pub(crate) struct ShareSchedule {
    /// `(first position, share)`, in increasing positions; the first from position 0.
    steps: RwLock<Vec<(usize, f32)>>,
}

impl ShareSchedule {
    /// `share` from the first position on.
    pub fn new(share: f32) -> ShareSchedule {
        ShareSchedule {
            steps: RwLock::new(vec![(0, share)]),
        }
    }

    /// The share in force at `position`.
    pub fn at(&self, position: usize) -> f32 {
        let steps = self.steps.read().unwrap_or_else(|e| e.into_inner());
        steps
            .iter()
            .rev()
            .find(|&&(from, _)| from <= position)
            .map_or(0.0, |&(_, share)| share)
    }

    /// `share` from `position` on (positions before the last step's are taken as that step's).
    pub fn set_from(&self, position: usize, share: f32) {
        let mut steps = self.steps.write().unwrap_or_else(|e| e.into_inner());
        let from = steps.last().map_or(0, |&(from, _)| from).max(position);
        steps.retain(|&(at, _)| at < from);
        steps.push((from, share));
    }

    /// The first position from which the GPU lane is offered any image (0 where it is offered
    /// none).
    pub fn first_offered(&self) -> usize {
        let steps = self.steps.read().unwrap_or_else(|e| e.into_inner());
        steps
            .iter()
            .find(|&&(_, share)| share > 0.0)
            .map_or(0, |&(from, _)| from)
    }

    /// Whether the image at `position` of the order, source index `index`, is offered to the
    /// GPU lane.
    pub fn offers(&self, position: usize, index: usize) -> bool {
        offered(index, self.at(position))
    }
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_gives_each_position_the_share_of_its_step() {
        let schedule = ShareSchedule::new(0.0);
        assert_eq!(schedule.at(0), 0.0);
        assert_eq!(schedule.first_offered(), 0);
        schedule.set_from(640, 0.5);
        assert_eq!(schedule.first_offered(), 640);
        assert_eq!((schedule.at(639), schedule.at(640)), (0.0, 0.5));
        schedule.set_from(2_000, 0.75);
        assert_eq!(schedule.at(1_999), 0.5);
        assert_eq!(schedule.at(5_000), 0.75);
        assert_eq!(schedule.first_offered(), 640);
        assert_eq!(ShareSchedule::new(0.75).first_offered(), 0);
        // A step never reaches back before the last one.
        schedule.set_from(100, 0.25);
        assert_eq!(schedule.at(1_000), 0.5);
        assert_eq!((schedule.at(1_999), schedule.at(2_000)), (0.5, 0.25));
        assert_eq!(schedule.at(5_000), 0.25);
        // Offers follow the step in force at the position.
        let offered_at = |position: usize| {
            (0..10_000)
                .filter(|&index| schedule.offers(position, index))
                .count()
        };
        assert_eq!(offered_at(0), 0);
        assert!((4_700..5_300).contains(&offered_at(700)));
        assert!((2_200..2_800).contains(&offered_at(3_000)));
    }
}
