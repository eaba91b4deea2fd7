// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for Tenstorrent's tt-kmd used only by `cargo xtask vm-test`.
 *
 * Like tt-kmd it is module "tenstorrent", reports the version it was built with in
 * /sys/module/tenstorrent/version, registers a character device region named "tenstorrent"
 * (listed in /proc/devices) and a device class whose nodes are /dev/tenstorrent/<minor>. It
 * creates one device, /dev/tenstorrent/0: while a process holds it open the module's refcnt is
 * raised and delete_module() fails with EAGAIN, which ttdp-kmod has to handle with the real
 * driver. Built with TT_STUB_FAIL_INIT its init fails with -EINVAL, standing for "a new version
 * that does not load" in the rollback tests.
 *
 * Two module parameters, readable in /sys/module/tenstorrent/parameters/ as tt-kmd's are, for
 * the module-parameter tests: reset_limit (uint, default 10) and auto_reset (bool, default Y,
 * shown as Y/N whatever was given).
 */
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/version.h>

static unsigned int reset_limit = 10;
module_param(reset_limit, uint, 0444);
MODULE_PARM_DESC(reset_limit, "stand-in for a tt-kmd parameter (default 10)");

static bool auto_reset = true;
module_param(auto_reset, bool, 0444);
MODULE_PARM_DESC(auto_reset, "stand-in for a boolean tt-kmd parameter (default Y)");

static dev_t tt_stub_devt;
static struct cdev tt_stub_cdev;
static struct class *tt_stub_class;

static int tt_stub_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations tt_stub_fops = {
	.owner = THIS_MODULE,
	.open = tt_stub_open,
	.llseek = noop_llseek,
};

/* Linux 6.2 made the device const and 6.4 dropped class_create()'s owner (Debian 13's 6.12). */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *tt_stub_devnode(const struct device *dev, umode_t *mode)
#else
static char *tt_stub_devnode(struct device *dev, umode_t *mode)
#endif
{
	if (mode)
		*mode = 0666;
	return kasprintf(GFP_KERNEL, "tenstorrent/%u", MINOR(dev->devt));
}

static int __init tt_stub_init(void)
{
	struct device *device;
	int err;

#ifdef TT_STUB_FAIL_INIT
	pr_err("tenstorrent stub " TT_STUB_VERSION ": init fails on purpose\n");
	return -EINVAL;
#endif
	err = alloc_chrdev_region(&tt_stub_devt, 0, 1, "tenstorrent");
	if (err)
		return err;
	cdev_init(&tt_stub_cdev, &tt_stub_fops);
	tt_stub_cdev.owner = THIS_MODULE;
	err = cdev_add(&tt_stub_cdev, tt_stub_devt, 1);
	if (err)
		goto unregister_region;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	tt_stub_class = class_create("tenstorrent");
#else
	tt_stub_class = class_create(THIS_MODULE, "tenstorrent");
#endif
	if (IS_ERR(tt_stub_class)) {
		err = PTR_ERR(tt_stub_class);
		goto delete_cdev;
	}
	tt_stub_class->devnode = tt_stub_devnode;
	device = device_create(tt_stub_class, NULL, tt_stub_devt, NULL, "tenstorrent!0");
	if (IS_ERR(device)) {
		err = PTR_ERR(device);
		goto destroy_class;
	}
	return 0;

destroy_class:
	class_destroy(tt_stub_class);
delete_cdev:
	cdev_del(&tt_stub_cdev);
unregister_region:
	unregister_chrdev_region(tt_stub_devt, 1);
	return err;
}

static void __exit tt_stub_exit(void)
{
	device_destroy(tt_stub_class, tt_stub_devt);
	class_destroy(tt_stub_class);
	cdev_del(&tt_stub_cdev);
	unregister_chrdev_region(tt_stub_devt, 1);
}

module_init(tt_stub_init);
module_exit(tt_stub_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("tenstorrent stub module for ttdp's real-kernel tests");
MODULE_VERSION(TT_STUB_VERSION);
