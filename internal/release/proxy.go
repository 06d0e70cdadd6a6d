package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// publish writes r's .info, .mod and .zip (made from its directory in src)
// into the module proxy directory proxy.
func publish(proxy, src string, r release, t time.Time) error {
	esc, err := module.EscapePath(r.Path)
	if err != nil {
		return err
	}
	dir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mv := module.Version{Path: r.Path, Version: r.Version}
	modDir := filepath.Join(src, filepath.FromSlash(r.Dir))
	cf, err := zip.CheckDir(modDir)
	if err != nil {
		return err
	}
	if err := cf.Err(); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(dir, r.Version+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, mv, modDir); err != nil {
		z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, r.Version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{r.Version, t})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, r.Version+".info"), info, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "list"), []byte(r.Version+"\n"), 0o644)
}
