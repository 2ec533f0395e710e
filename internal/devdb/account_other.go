//go:build !unix

package devdb

import "os/exec"

type account struct{}

func unprivileged() (*account, error) { return nil, nil }

func (a *account) apply(*exec.Cmd) {}

func (a *account) own(string) error { return nil }
