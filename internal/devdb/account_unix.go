//go:build unix

package devdb

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// account is the unprivileged user a throwaway cluster runs as when this process is root
// (initdb refuses root). Nil means this process's own user.
type account struct {
	name     string
	uid, gid uint32
}

func unprivileged() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root and no unprivileged user (postgres or nobody) to run initdb as; " +
		"create one, or set DATABASE_URL")
}

func (a *account) apply(cmd *exec.Cmd) {
	if a == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: a.uid, Gid: a.gid, NoSetGroups: true}}
	// Run from a folder the account can read, with a HOME it may use.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+os.TempDir())
}

func (a *account) own(dir string) error {
	if a == nil {
		return nil
	}
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, int(a.uid), int(a.gid))
	})
}
