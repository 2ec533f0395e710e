package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// Disk is a small filesystem of a throwaway cluster's own (a tmpfs), with a tablespace on it or
// the server's write-ahead log: a disk that a test can fill to the last byte and free again while
// the server runs, to see what the engine does when a write finds no space (SQLSTATE 53100,
// disk_full; for the WAL, the server's PANIC) and after.
type Disk struct {
	// Tablespace is the tablespace's name (empty for MoveWAL's); Dir is the mount point.
	Tablespace, Dir string
	ballast         string
}

// AddDisk mounts a tmpfs of size bytes in a throwaway cluster's folder and creates the
// tablespace name on it. Mounting needs root (CAP_SYS_ADMIN): elsewhere it fails with an error
// that says so. Close drops nothing of the tablespace's (the cluster goes whole) and unmounts
// the disk before removing the folder.
func (d *DB) AddDisk(ctx context.Context, name string, size int64) (*Disk, error) {
	if d.dir == "" {
		return nil, errors.New("devdb: AddDisk: not a throwaway cluster")
	}
	dir, err := d.mount(name, size)
	if err != nil {
		return nil, err
	}
	loc := filepath.Join(dir, "pg")
	if err := os.Mkdir(loc, 0o700); err != nil {
		return nil, err
	}
	if err := d.runAs.own(loc); err != nil {
		return nil, fmt.Errorf("devdb: give %s to the postgres user: %w", loc, err)
	}
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLESPACE %s LOCATION '%s'",
		pgx.Identifier{name}.Sanitize(), loc)); err != nil {
		return nil, fmt.Errorf("devdb: create tablespace %s: %w", name, err)
	}
	return &Disk{Tablespace: name, Dir: dir, ballast: filepath.Join(dir, "ballast")}, nil
}

// MoveWAL mounts a tmpfs of size bytes in a throwaway cluster's folder and moves the server's
// write-ahead log onto it: the server stops (fast), its pg_wal folder goes to the disk whole
// (owners kept) with a symlink in its place, and the server starts again. The Disk has no
// tablespace; Fill and Free work as on AddDisk's. Mounting needs root.
func (d *DB) MoveWAL(ctx context.Context, size int64) (*Disk, error) {
	if d.dir == "" {
		return nil, errors.New("devdb: MoveWAL: not a throwaway cluster")
	}
	dir, err := d.mount("wal", size)
	if err != nil {
		return nil, err
	}
	if err := d.Stop(ctx, "fast"); err != nil {
		return nil, err
	}
	wal, moved := filepath.Join(d.data, "pg_wal"), filepath.Join(dir, "pg_wal")
	// cp -a keeps the files' owner (the postgres user) and modes; a rename cannot cross disks.
	if out, err := exec.CommandContext(ctx, "cp", "-a", wal, moved).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("devdb: copy %s to %s: %w: %s", wal, moved, err, out)
	}
	if err := os.RemoveAll(wal); err != nil {
		return nil, err
	}
	if err := os.Symlink(moved, wal); err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		return nil, err
	}
	return &Disk{Dir: dir, ballast: filepath.Join(dir, "ballast")}, nil
}

// mount mounts a tmpfs of size bytes at the cluster folder's disk-name, unmounted by Close.
func (d *DB) mount(name string, size int64) (string, error) {
	dir := filepath.Join(d.dir, "disk-"+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		return "", fmt.Errorf("devdb: mount a tmpfs at %s (needs root): %w", dir, err)
	}
	d.mounts = append(d.mounts, dir)
	return dir, nil
}

// Fill writes a ballast file on the disk until the disk has no byte left, and returns how many
// bytes it wrote. From then on every write of the server's that needs a new block there fails.
func (k *Disk) Fill() (int64, error) {
	f, err := os.OpenFile(k.ballast, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	var n int64
	// Large writes, then page-sized ones for the last pages.
	for _, chunk := range []int{1 << 20, 4096} {
		buf := make([]byte, chunk)
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				_ = f.Close()
				return n, err
			}
		}
	}
	return n, f.Close()
}

// Free removes the ballast: the space it held is free again at once.
func (k *Disk) Free() error {
	err := os.Remove(k.ballast)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Available is the space left on the disk, in bytes.
func (k *Disk) Available() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(k.Dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// unmount unmounts the disks of a cluster whose server has stopped.
func unmount(dirs []string, logw io.Writer) error {
	var errs []error
	for _, dir := range dirs {
		if err := syscall.Unmount(dir, 0); err != nil {
			fmt.Fprintf(logw, "devdb: unmount %s: %v\n", dir, err)
			errs = append(errs, fmt.Errorf("devdb: unmount %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
