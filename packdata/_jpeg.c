/* One region of a JPEG decoded, at a reduced DCT scale: packdata/jpegregion.py's native path.
 *
 * A random-resized crop keeps on average about half of an image, and a decode stage that
 * decodes the whole JPEG and then crops spends the rest of the decode on pixels it drops. With
 * libjpeg's own calls the rows above the region are skipped (their coefficients still entropy
 * decoded, nothing else: jpeg_skip_scanlines), the rows below it are never decoded, and each row
 * is decoded only across the columns of the region, widened to whole iMCU columns
 * (jpeg_crop_scanline). The pixels inside the region are those of the whole decode, bit for bit,
 * except in a column at the edge of the decoded columns, where the chroma upsampling sees no
 * neighbour: the caller asks for one column more each side of what it keeps.
 *
 * Built only where libjpeg's headers are found (libjpeg-turbo: jpeg_crop_scanline and
 * jpeg_skip_scanlines); otherwise packdata decodes whole images through simplejpeg.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

struct failure {
    struct jpeg_error_mgr manager;
    jmp_buf jump;
    int warned;  /* corrupt data libjpeg decoded past: refused (the caller decodes it whole) */
    char message[JMSG_LENGTH_MAX];
};

static void
on_error(j_common_ptr info)
{
    struct failure *f = (struct failure *)info->err;
    (*info->err->format_message)(info, f->message);
    longjmp(f->jump, 1);
}

static void
on_message(j_common_ptr info, int level)
{
    struct failure *f = (struct failure *)info->err;
    if (level < 0 && !f->warned) {  /* a warning; trace messages (level >= 0) are dropped */
        f->warned = 1;
        (*info->err->format_message)(info, f->message);
    }
}

/* decode_region(data, scale_denom, left, top, right, bottom, grey, out) -> (x0, width)
 *
 * Rows [top, bottom) of the image decoded at 1/scale_denom, columns [x0, x0 + width) with
 * x0 <= left and x0 + width >= right, written to `out` (writable, C-contiguous) as
 * (bottom - top) rows of width * channels bytes: RGB, or one grey channel where `grey`. */
static PyObject *
decode_region(PyObject *self, PyObject *args)
{
    Py_buffer data, out;
    int denom, left, top, right, bottom, grey;
    if (!PyArg_ParseTuple(args, "y*iiiiipw*", &data, &denom, &left, &top, &right, &bottom,
                          &grey, &out))
        return NULL;
    struct jpeg_decompress_struct info;
    struct failure failure;
    volatile int ok = 1, created = 0;
    JDIMENSION x0 = 0, width = 0;
    memset(&failure, 0, sizeof failure);
    info.err = jpeg_std_error(&failure.manager);
    failure.manager.error_exit = on_error;
    failure.manager.emit_message = on_message;

    Py_BEGIN_ALLOW_THREADS
    if (setjmp(failure.jump)) {
        ok = 0;
        goto done;
    }
    jpeg_create_decompress(&info);
    created = 1;
    jpeg_mem_src(&info, data.buf, (unsigned long)data.len);
    jpeg_read_header(&info, TRUE);
    info.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
    info.scale_num = 1;
    info.scale_denom = (unsigned int)denom;
    jpeg_start_decompress(&info);
    if (left < 0 || top < 0 || right <= left || bottom <= top
            || (JDIMENSION)right > info.output_width || (JDIMENSION)bottom > info.output_height) {
        snprintf(failure.message, sizeof failure.message,
                 "region [%d, %d) x [%d, %d) is not inside the %ux%u image", left, right, top,
                 bottom, info.output_width, info.output_height);
        ok = 0;
        goto done;
    }
    x0 = (JDIMENSION)left;
    width = (JDIMENSION)(right - left);
    if (width < info.output_width)
        jpeg_crop_scanline(&info, &x0, &width);
    size_t row_bytes = (size_t)width * (size_t)info.output_components;
    if ((size_t)(bottom - top) * row_bytes > (size_t)out.len) {
        snprintf(failure.message, sizeof failure.message, "output of %zd bytes is too small",
                 out.len);
        ok = 0;
        goto done;
    }
    if (top > 0 && jpeg_skip_scanlines(&info, (JDIMENSION)top) != (JDIMENSION)top) {
        snprintf(failure.message, sizeof failure.message, "rows above the region are missing");
        ok = 0;
        goto done;
    }
    for (int y = top; y < bottom && ok; y++) {
        JSAMPROW row = (JSAMPROW)((char *)out.buf + (size_t)(y - top) * row_bytes);
        if (jpeg_read_scanlines(&info, &row, 1) != 1)
            ok = 0;
    }
    if (!ok)
        snprintf(failure.message, sizeof failure.message, "the region's rows cannot be read");
    else if (failure.warned)
        ok = 0;
done:
    if (created)
        jpeg_destroy_decompress(&info);  /* also abandons the rows below the region */
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, failure.message);
        return NULL;
    }
    return Py_BuildValue("(kk)", (unsigned long)x0, (unsigned long)width);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_denom, left, top, right, bottom, grey, out) -> (x0, width)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "packdata._jpeg",
    "One region of a JPEG decoded at a reduced DCT scale (libjpeg).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jpeg(void)
{
    return PyModule_Create(&module);
}
