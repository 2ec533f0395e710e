package durablemigrate

import "time"

// SetLockTryFor sets how long a step waits for its tables' locks, until the test ends.
func SetLockTryFor(cleanup func(func()), d time.Duration) {
	prior := lockTryFor
	lockTryFor = d
	cleanup(func() { lockTryFor = prior })
}
