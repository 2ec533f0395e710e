package races

import (
	"fmt"
	"os"
)

// helperMain runs the test binary as a worker process of the given role.
func helperMain(role string) int {
	fmt.Fprintln(os.Stderr, "races: unknown helper role", role)
	return 2
}
