// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for Tenstorrent's tt-kmd used only by `cargo xtask vm-test`.
 *
 * It has the same module name ("tenstorrent"), reports the version it was built with in
 * /sys/module/tenstorrent/version, and creates /dev/tenstorrent/0: while a process holds that
 * device open the module's refcnt is raised and delete_module() fails with EAGAIN, exactly what
 * ttdp-kmod has to handle with the real driver. Built with TT_STUB_FAIL_INIT=1 its init fails with
 * -EINVAL, which stands for "a new version that does not load" in the rollback tests.
 */
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

static int tt_stub_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations tt_stub_fops = {
	.owner = THIS_MODULE,
	.open = tt_stub_open,
	.llseek = noop_llseek,
};

static struct miscdevice tt_stub_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "tenstorrent",
	.nodename = "tenstorrent/0",
	.mode = 0666,
	.fops = &tt_stub_fops,
};

static int __init tt_stub_init(void)
{
#ifdef TT_STUB_FAIL_INIT
	pr_err("tenstorrent stub " TT_STUB_VERSION ": init fails on purpose\n");
	return -EINVAL;
#else
	return misc_register(&tt_stub_device);
#endif
}

static void __exit tt_stub_exit(void)
{
#ifndef TT_STUB_FAIL_INIT
	misc_deregister(&tt_stub_device);
#endif
}

module_init(tt_stub_init);
module_exit(tt_stub_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("tenstorrent stub module for ttdp's real-kernel tests");
MODULE_VERSION(TT_STUB_VERSION);
