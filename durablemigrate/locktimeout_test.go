package durablemigrate

import (
	"strings"
	"testing"
)

// The migrator sets the lock_timeout of a step it applies to an existing schema itself, in
// place of the file's: every lock_timeout a migration file sets must be a line it recognizes.
func TestEveryLockTimeoutOfAMigrationIsOneTheMigratorReplaces(t *testing.T) {
	for _, m := range migrations {
		for dir, text := range map[string]string{"up": m.up, "down": m.down} {
			if n, k := strings.Count(text, "lock_timeout"), len(fileLockTimeout.FindAllString(text, -1)); n != k {
				t.Errorf("version %d (%s) %s: %d mentions of lock_timeout, %d of them lines `SET LOCAL lock_timeout = '…';`",
					m.Version, m.Name, dir, n, k)
			}
		}
	}
}
